"""Deferred fold results: constants whose buffers are filled only when something reads them.

Most of a model's folded weights (a transformer's transposed matrices, a CNN's scaled and
re-laid-out kernels) only ever become arguments of fused functions, which no task contains;
computing them was a third of a transformer's extraction. Inside :func:`deferred_placeholders`
the folder makes large results as placeholders of the right type, and whoever runs a pass that
may read constant values fills what it reads first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import tvm
from tvm import relay

from ..ir import is_primitive_task, patched, raw_data
from .evaluate import Array
from .jit import Kernels

#: Inside the pipeline, fold results at least this large are not computed until something reads
#: them.
DEFER_MIN_ELEMENTS = 4096


class Deferred:
    """The deferred results of one extraction: each placeholder still unfilled, and how to
    compute it, by the address of its buffer (passes rebuild Constant nodes around the same
    arrays; the placeholders are kept alive here, so no address is reused meanwhile); and the
    TVM kernels that compute some of them (:class:`~.jit.Kernels`), built once when first run.
    """

    def __init__(self) -> None:
        self.unfilled: dict[int, relay.Constant] = {}
        self.compute: dict[int, Callable[[], Array | tvm.nd.NDArray]] = {}
        self.kernels = Kernels()
        #: The placeholders whose value needs a kernel run (or, in turn, such a value).
        self.awaiting: set[int] = set()
        #: Bytes of the constants folds have made so far (see :func:`.fold.bounded`).
        self.made_bytes = 0

    def add(
        self,
        const: relay.Constant,
        compute: Callable[[], Array | tvm.nd.NDArray],
        *,
        needs_kernel: bool = False,
    ) -> None:
        """``const`` is a placeholder whose value ``compute`` gives when it is first read."""
        key = buffer_address(raw_data(const))
        self.compute[key] = compute
        self.unfilled[key] = const
        if needs_kernel:
            self.awaiting.add(key)

    def needs_kernel(self, const: relay.Constant) -> bool:
        """Whether computing ``const`` would build kernels (until it is filled)."""
        return buffer_address(raw_data(const)) in self.awaiting


_DEFERRED: ContextVar[Deferred | None] = ContextVar("relay_tasks_deferred", default=None)


def current() -> Deferred | None:
    """The deferred results of the extraction running in this context, if folds may defer."""
    return _DEFERRED.get()


@contextlib.contextmanager
def deferred_placeholders() -> Iterator[dict[int, relay.Constant]]:
    """Allow folds to defer large results while this is open; yields the placeholders still
    unfilled.

    Whoever runs passes in between must fill what they read: :func:`fill_all` before a pass
    that may read constant values, :func:`fill` for each constant a pass reads,
    :func:`filled_on_read` around Python hooks.
    """
    deferred = Deferred()
    token = _DEFERRED.set(deferred)
    try:
        yield deferred.unfilled
    finally:
        _DEFERRED.reset(token)


def fill(const: relay.Constant) -> None:
    """Compute ``const``'s value now if it is a deferred placeholder."""
    deferred = _DEFERRED.get()
    if deferred is None or not deferred.compute:
        return
    data = raw_data(const)
    key = buffer_address(data)
    compute = deferred.compute.pop(key, None)
    if compute is not None:
        data.copyfrom(compute())
        deferred.unfilled.pop(key, None)
        deferred.awaiting.discard(key)


def fill_all() -> None:
    """Compute every deferred value: before anything that may read any constant."""
    deferred = _DEFERRED.get()
    if deferred is None:
        return
    for const in list(deferred.unfilled.values()):
        fill(const)


def _fill_if_constant(node: Any) -> None:
    if isinstance(node, relay.Constant):
        fill(node)


def filled_data(const: relay.Constant) -> tvm.nd.NDArray:
    fill(const)
    return raw_data(const)


def filled_on_read() -> contextlib.AbstractContextManager[None]:
    """Make every read of a Relay constant's ``data`` from Python fill it first: for passes
    that call Python hooks (layout hooks are given the weights, and some read them). Each
    thread fills from its own extraction's placeholders; outside one, reads are as before."""
    return patched(relay.Constant, "data", _FILLED_DATA)


_FILLED_DATA = property(filled_data)


def fill_inside_tasks(fused: tvm.IRModule) -> None:
    """Compute the placeholders that ``FuseOps`` put inside primitive functions: lowering reads
    their values into the tasks. FuseOps keeps scalar constants inside the functions it fuses
    (other constants become their arguments unless params are linked, when nothing is
    deferred), and a scalar can be a kernel's result, awaiting its build."""
    deferred = _DEFERRED.get()
    if deferred is None or not deferred.compute:
        return

    def visit(node: Any) -> None:
        if isinstance(node, relay.Function) and is_primitive_task(node):
            relay.analysis.post_order_visit(node.body, _fill_if_constant)

    for func in fused.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)


def buffer_address(data: tvm.nd.NDArray) -> int:
    """The address of an NDArray's bytes: the identity of what a constant holds."""
    return int(data.handle.contents.data or 0)
