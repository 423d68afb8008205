"""Deferred fold results: constants whose buffers are filled only when something reads them.

Most of a model's folded weights (a transformer's transposed matrices, a CNN's scaled and
re-laid-out kernels) only ever become arguments of fused functions, which no task contains;
computing them was a third of a transformer's extraction. Inside :func:`deferred_placeholders`
the folder makes large results as placeholders of the right type, and whoever runs a pass that
may read constant values fills what it reads first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import tvm
from tvm import relay
from tvm.runtime import Object

from ..errors import ExtractionError
from ..ir import is_primitive_task, patched
from .evaluate import Array

#: Inside the pipeline, fold results at least this large are not computed until something reads
#: them.
DEFER_MIN_ELEMENTS = 4096


class Deferred:
    """The deferred results of one extraction: each placeholder still unfilled, and how to
    compute it, by the address of its buffer (passes rebuild Constant nodes around the same
    arrays; the placeholders are kept alive here, so no address is reused meanwhile)."""

    def __init__(self) -> None:
        self.unfilled: dict[int, relay.Constant] = {}
        self.compute: dict[int, Callable[[], Array]] = {}

    def add(self, const: relay.Constant, compute: Callable[[], Array]) -> None:
        """``const`` is a placeholder whose value ``compute`` gives when it is first read."""
        key = buffer_address(raw_data(const))
        self.compute[key] = compute
        self.unfilled[key] = const


_DEFERRED: ContextVar[Deferred | None] = ContextVar("relay_tasks_deferred", default=None)


def current() -> Deferred | None:
    """The deferred results of the extraction running in this context, if folds may defer."""
    return _DEFERRED.get()


@contextlib.contextmanager
def deferred_placeholders() -> Iterator[dict[int, relay.Constant]]:
    """Allow folds to defer large results while this is open; yields the placeholders still
    unfilled, for :func:`refuse_placeholders` to check once the module is fused.

    Whoever runs passes in between must fill what they read: :func:`fill_all` before a pass
    that may read constant values, :func:`fill_within` for the part of a graph a pass sees,
    :func:`filled_on_read` around Python hooks.
    """
    deferred = Deferred()
    token = _DEFERRED.set(deferred)
    try:
        yield deferred.unfilled
    finally:
        _DEFERRED.reset(token)


def raw_data(const: relay.Constant) -> tvm.nd.NDArray:
    """A constant's NDArray, read without filling it (see :func:`filled_on_read`)."""
    data: tvm.nd.NDArray = Object.__getattr__(const, "data")
    return data


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


def fill_all() -> None:
    """Compute every deferred value: before anything that may read any constant."""
    deferred = _DEFERRED.get()
    if deferred is None:
        return
    for const in list(deferred.unfilled.values()):
        fill(const)


def fill_within(mod: tvm.IRModule) -> tvm.IRModule:
    """Compute the deferred values among ``mod``'s constants (what a pass given ``mod`` sees);
    returns ``mod``."""
    deferred = _DEFERRED.get()
    if deferred is not None and deferred.compute:
        for func in mod.functions.values():
            relay.analysis.post_order_visit(func, _fill_if_constant)
    return mod


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


def refuse_placeholders(fused: tvm.IRModule, unfilled: Mapping[int, relay.Constant]) -> None:
    """Fail loudly if a placeholder that was never filled sits inside a primitive function:
    lowering would read its uninitialised buffer into the task (constants are linked into fused
    functions only with ``link-params``, when nothing is deferred; this guards that rule)."""
    if not unfilled:
        return
    # By buffer, not by node: FuseOps rebuilds the Constant nodes around the same arrays.
    buffers = {buffer_address(raw_data(const)) for const in unfilled.values()}
    found: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, relay.Function) and is_primitive_task(node):
            inner: list[Any] = []
            relay.analysis.post_order_visit(node.body, inner.append)
            held = (buffer_address(n.data) for n in inner if isinstance(n, relay.Constant))
            if any(address in buffers for address in held):
                found.append(str(node.attrs["hash"]) if "hash" in node.attrs else "a function")

    for func in fused.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)
    if found:
        raise ExtractionError(
            f"a constant whose value was deferred and never computed is inside {found[0]}; "
            "relay-tasks would lower an uninitialised buffer (please report this model)"
        )


def buffer_address(data: tvm.nd.NDArray) -> int:
    """The address of an NDArray's bytes: the identity of what a constant holds."""
    return int(data.handle.contents.data or 0)
