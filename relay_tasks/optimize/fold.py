"""Constant folding in numpy, bit-identical to TVM's ``FoldConstant`` for the ops it covers.

Upstream's ``FoldConstant`` evaluates every call whose arguments are all constants by compiling it
with LLVM and running it (a fresh build and MCJIT load per call: about 80% of upstream's
extraction time). The weights-side arithmetic that reaches it (batch-norm folding, layout changes
of weights, position-id arithmetic) is exact in numpy, so this module evaluates those calls
directly; the calls numpy does not cover go to TVM's own kernels, all built at once when a value
is first read (:mod:`.jit`); every structural subtlety of the pass (let-inlining, tuples, ``if``,
``shape_of``) is left to TVM's own ``FoldConstant``, and when nothing of that kind is left,
TVM's pass is skipped and the module only typed, which is all it would have done.

A call is folded in numpy only when its op has an evaluator, its inputs are free of NaN (whose
payload is not portable through arithmetic; ops that only move elements keep it), and the result
has exactly the shape and dtype Relay inferred for the call; anything else is TVM's kernel."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relay

from ..errors import ModelError, UsageError
from ..ir import node_key, op_name, raw_data, reads_of, rebuild, with_children, with_functions
from .evaluate import EVALUATORS, Array, as_ndarray, evaluate_call, known_type
from .jit import constant_leaves, evaluated_by_tvm, folded_alone, static
from .placeholders import (
    DEFER_MIN_ELEMENTS,
    Deferred,
    current,
    deferred_placeholders,
    fill,
    fill_all,
    filled_data,
)


def prefold_function(func: relay.Function, *, defer: bool = False) -> tuple[relay.Function, bool]:
    """Replace each call that numpy can evaluate (all args constant) by its value; also tell
    whether the result still has anything TVM's ``FoldConstant`` rewrites.

    With ``defer`` (and inside :func:`deferred_placeholders`), large results are not computed:
    the call becomes a constant of the right type whose buffer is filled only when something
    reads it. Most of a model's folded weights (a transformer's transposed matrices, a CNN's
    scaled and re-laid-out kernels) only ever become arguments of fused functions: no task
    contains them, and computing them was a third of a transformer's extraction.
    """
    return _Prefolder(defer).fold(func)


class _Prefolder:
    def __init__(self, defer: bool) -> None:
        #: Where fold results wait to be computed (None outside an extraction or a fold's scope:
        #: then every call numpy does not evaluate is left to TVM's pass).
        self.deferred = current()
        #: Whether large results numpy computes wait until read (see :func:`prefold_function`).
        self.defer_large = defer and self.deferred is not None
        self.views: dict[int, Array] = {}
        #: Each constant made, with the type of the call it replaces (see :func:`typed_in_place`).
        self.made: list[tuple[relay.Constant, Any]] = []

    def fold(self, func: relay.Function) -> tuple[relay.Function, bool]:
        """The folded function, and whether it still has anything TVM's FoldConstant rewrites.

        That is False only when none of its nodes is of a kind that pass rewrites
        (conservatively: any ``let``, ``if``, projection of a tuple literal, ``on_device``,
        shape query, primitive function, or op call whose arguments are all constants), so
        that skipping the pass returns what it would.
        """
        reads = reads_of(func)
        if any(_needs_tvm(n) for n in reads.nodes):
            return func, True
        memo: dict[int, relay.Expr] = {}

        def get(expr: Any) -> Any:
            return memo.get(node_key(expr), expr) if isinstance(expr, relay.Expr) else expr

        left = False
        for node in reads.nodes:
            op = reads.op(node) if isinstance(node, relay.Call) else None
            if isinstance(op, tvm.ir.Op):
                new, kept = self._fold_call(node, op, reads.args(node), get)
            else:
                new = rebuild(node, get)
                if new is None:
                    return func, True  # a node kind this folder does not rebuild: all to TVM
                kept = _tvm_rewrites_node(new)
            left = left or kept
            memo[node_key(node)] = new
        return memo[node_key(func)], left

    def _fold_call(
        self,
        original: relay.Call,
        op: tvm.ir.Op,
        old_args: list[relay.Expr],
        get: Callable[[Any], Any],
    ) -> tuple[relay.Expr, bool]:
        """The op call ``original`` (of ``op`` on ``old_args``) with its arguments folded
        (``get``), as a constant where it evaluates; else the call and whether TVM's
        FoldConstant may still rewrite it: it evaluates every op call whose arguments are all
        constants, and looks through ``on_device`` annotations. (Each field is read once: reads
        go through TVM's FFI.)"""
        args = [get(arg) for arg in old_args]
        call = original
        if not all(a.same_as(b) for a, b in zip(args, old_args, strict=True)):
            call = with_children(original, [op, *args])
        operands = constant_leaves(args)
        name = op_name(op)
        if operands is None:
            return call, name == "on_device"
        ttype = known_type(original, call)
        deferred = self.deferred
        bounded(name, ttype, deferred)
        awaiting = deferred is not None and any(deferred.needs_kernel(c) for c in operands)
        if name in EVALUATORS and awaiting and _is_tensor(ttype):
            # Computed when read, once its operands are: numpy never forces a build early.
            const = self._deferred_constant(call, operands, ttype, needs_kernel=True)
            return self._made(const, ttype)
        if name in EVALUATORS and not awaiting:
            if self.defer_large and _is_large(ttype):
                return self._made(self._deferred_constant(call, operands, ttype), ttype)
            values = [self.value_of(c) for c in operands]
            result = evaluate_call(call, values, ttype)
            if result is not None:
                for const, value in zip(operands, values, strict=True):
                    if _samebuffer_address(result, value):  # a reshape: the operand's bytes
                        return self._made(
                            relay.Constant(const.data._create_view(result.shape)), ttype
                        )
                return self._made(relay.Constant(as_ndarray(result)), ttype)
        if deferred is None or not evaluated_by_tvm(op) or not _is_tensor(ttype):
            return call, True
        return self._made(self._kernel_result(deferred, call, operands, ttype), ttype)

    def _made(self, const: relay.Constant, ttype: Any) -> tuple[relay.Expr, bool]:
        self.made.append((const, ttype))
        return const, False

    def _deferred_constant(
        self,
        call: relay.Call,
        operands: list[relay.Constant],
        ttype: Any,
        *,
        needs_kernel: bool = False,
    ) -> relay.Constant:
        """A placeholder for what numpy computes when something reads it (TVM's kernel, where
        numpy declines then: NaN inputs, say)."""
        const = _placeholder(ttype)
        deferred = self.deferred
        assert deferred is not None

        def compute() -> Array | tvm.nd.NDArray:
            result = evaluate_call(call, [self.value_of(c) for c in operands], ttype)
            if result is not None:
                return result
            return _kernel_value(deferred, deferred.kernels.add(call), operands)

        deferred.add(const, compute, needs_kernel=needs_kernel)
        return const

    def _kernel_result(
        self, deferred: Deferred, call: relay.Call, operands: list[relay.Constant], ttype: Any
    ) -> relay.Constant:
        """A placeholder for what TVM's kernel for ``call`` computes, built with every other
        kernel of the extraction when a value is first read."""
        const = _placeholder(ttype)
        index = deferred.kernels.add(call)
        deferred.add(const, lambda: _kernel_value(deferred, index, operands), needs_kernel=True)
        return const

    def value_of(self, const: relay.Constant) -> Array:
        fill(const)
        key = node_key(const)
        if key not in self.views:
            self.views[key] = array_view(raw_data(const))
        return self.views[key]


#: The bytes one folded constant, and all of one extraction's, may take: the largest weights of
#: real models are a few hundred MB, and a model file of a few hundred bytes can ask for
#: gigabytes (``full(1f, shape=[34000, 34000])``). Settable by the environment variables named.
MAX_CONSTANT: tuple[str, int] = ("RELAY_TASKS_MAX_CONSTANT_BYTES", 1 << 30)
MAX_CONSTANTS: tuple[str, int] = ("RELAY_TASKS_MAX_CONSTANTS_BYTES", 8 << 30)


def bounded(op: str, ttype: Any, deferred: Deferred | None) -> None:
    """Refuse, before anything is allocated, a fold of ``op`` whose result would take more than
    :data:`MAX_CONSTANT`, or take the extraction's constants past :data:`MAX_CONSTANTS`."""
    size: int = _bytes(ttype)
    one, total = constant_limit(), _limit(*MAX_CONSTANTS)
    spent = deferred.made_bytes if deferred is not None else 0
    if size > one or spent + size > total:
        shape = "x".join(str(int(d)) for d in ttype.shape) or "scalar"
        over = (
            f"more than the {_sized(one)} one folded constant may take"
            if size > one
            else f"which takes the model's folded constants past {_sized(total)}"
        )
        raise ModelError(
            f"folding {op} makes a constant of {shape} {ttype.dtype} ({_sized(size)}), "
            f"{over}: no real model's weights are that large; check the model, or raise the "
            f"limit with {MAX_CONSTANT[0] if size > one else MAX_CONSTANTS[0]}=BYTES"
        )
    if deferred is not None:
        deferred.made_bytes += size


def constant_limit() -> int:
    """The bytes one constant made from a model may take (:data:`MAX_CONSTANT`)."""
    return _limit(*MAX_CONSTANT)


def _sized(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} bytes"


def _bytes(ttype: Any) -> int:
    """The bytes of a tensor type of static shape (0 for anything else)."""
    if not _is_tensor(ttype):
        return 0
    dtype = tvm.DataType(str(ttype.dtype))
    elements: int = math.prod(int(d) for d in ttype.shape)
    return elements * ((int(dtype.bits) * int(dtype.lanes) + 7) // 8)


def _limit(variable: str, default: int) -> int:
    text = os.environ.get(variable, "")
    if not text:
        return default
    if not text.isdigit():
        raise UsageError(f"{variable}={text!r} is not a number of bytes")
    return int(text)


def _samebuffer_address(result: Array, operand: Array) -> bool:
    """Whether ``result`` is ``operand``'s buffer, byte for byte, under another shape.

    Such a result becomes a view of the operand's NDArray instead of a copy (BERT-base from
    PyTorch folds each of its 72 weight matrices through a reshape and a broadcast that add a
    batch axis: 650 MB of copies otherwise). Constants are never written to, so sharing is safe.
    """
    return (
        result.flags.c_contiguous
        and operand.flags.c_contiguous
        and result.dtype == operand.dtype
        and result.nbytes == operand.nbytes > 0
        and result.ctypes.data == operand.ctypes.data
    )


def _placeholder(ttype: Any) -> relay.Constant:
    return relay.Constant(tvm.nd.empty([int(d) for d in ttype.shape], str(ttype.dtype)))


def _kernel_value(deferred: Deferred, index: int, operands: list[relay.Constant]) -> Any:
    return deferred.kernels.run(index, [filled_data(c) for c in operands])


def _is_tensor(ttype: Any) -> bool:
    """A tensor of known shape: what a placeholder can stand for."""
    return isinstance(ttype, relay.TensorType) and static(ttype)


def _is_large(ttype: Any) -> bool:
    if not isinstance(ttype, relay.TensorType):
        return False
    dims = [d for d in ttype.shape]
    if not all(isinstance(d, tvm.tir.IntImm) for d in dims):
        return False
    return int(np.prod([int(d) for d in dims])) >= DEFER_MIN_ELEMENTS


def array_view(data: tvm.nd.NDArray) -> Array:
    """The constant's data as numpy, without copying where DLPack allows."""
    try:
        return np.asarray(np.from_dlpack(data))
    except (RuntimeError, TypeError, BufferError):
        return np.asarray(data.numpy())  # dtypes DLPack export does not cover (bool)


def folded_call(call: relay.Call) -> relay.Constant:
    """What TVM's ``FoldConstantExpr`` makes of ``call``, an op call on constants: its value
    computed here where an evaluator covers it, else by TVM (deferred operands are computed)."""
    operands = constant_leaves(list(call.args))
    if operands is not None:
        result = evaluate_call(call, [array_view(filled_data(c)) for c in operands])
        if result is not None:
            return relay.Constant(as_ndarray(result))
    for const in operands or ():
        fill(const)
    folded: relay.Constant = folded_alone(call)
    return folded


_TYPE_DEPENDENT_OPS = frozenset({"shape_of", "vm.shape_of", "ndarray_size"})


def _needs_tvm(node: Any) -> bool:
    """Graph features whose folding depends on more than values: left entirely to TVM.

    FoldConstant never folds inside primitive functions, and it folds ``shape_of`` from the types
    of the original nodes, which a rebuilt graph would not carry.
    """
    if isinstance(node, relay.Function):
        attrs = node.attrs
        return attrs is not None and "Primitive" in attrs and int(attrs["Primitive"]) != 0
    return isinstance(node, tvm.ir.Op) and node.name in _TYPE_DEPENDENT_OPS


def links_params(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> bool:
    """Whether FuseOps will put constants inside the fused functions, decided as FuseOps decides:
    ``relay.FuseOps.link_params`` if set, else the module's executor's ``link-params``."""
    configured = ctx.config.get("relay.FuseOps.link_params")
    if configured is not None:
        return bool(configured)
    executor = mod.get_attr("executor")
    attrs = executor.attrs if executor is not None else None
    return attrs is not None and "link-params" in attrs and bool(attrs["link-params"])


def fold_module(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """:class:`FoldConstant`'s work: every Relay function prefolded, then TVM's fold where
    anything is left for it (after computing every deferred value: it may read any).

    Inside an extraction, results wait in its placeholders until something reads them. Outside
    one, or when FuseOps will link constants into the fused functions (so that lowering reads
    them all), the fold has a scope of its own and computes everything before it returns: its
    kernels still built once.
    """
    if current() is not None and not links_params(mod, ctx):
        return _fold_functions(mod, defer=True)
    with deferred_placeholders():
        folded = _fold_functions(mod, defer=False)
        fill_all()
        return folded


def _fold_functions(mod: tvm.IRModule, *, defer: bool) -> tvm.IRModule:
    updates = {}
    left_for_tvm = False
    made: list[tuple[relay.Constant, Any]] = []
    for gvar, func in mod.functions.items():
        if isinstance(func, relay.Function):
            prefolder = _Prefolder(defer)
            folded, left = prefolder.fold(func)
            left_for_tvm = left_for_tvm or left
            if not folded.same_as(func):
                updates[gvar] = folded
                made += prefolder.made
    if left_for_tvm:
        folding = with_functions(mod, updates)
        _bounded_for_tvm(folding)
        fill_all()
        return relay.transform.FoldConstant()(folding)
    return only_typed(with_functions(mod, updates), made)


def _bounded_for_tvm(mod: tvm.IRModule) -> None:
    """:func:`bounded` for each op call TVM's fold may evaluate (all its arguments constants)
    whose type is known, before TVM allocates its result."""

    def visit(node: Any) -> None:
        if (
            isinstance(node, relay.Call)
            and isinstance(node.op, tvm.ir.Op)
            and constant_leaves(list(node.args)) is not None
        ):
            try:
                ttype = node.checked_type
            except ValueError:  # never typed: the pass types it before it folds
                return
            bounded(op_name(node.op), ttype, None)

    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)


def typed_in_place(made: Sequence[tuple[relay.Constant, Any]]) -> bool:
    """Type each new constant in place, if each has exactly the type of the call it replaced
    (the call's type from the last inference, or None when it had none); False when one does
    not, and the module must be typed again.

    When every replacement keeps its type, type inference over the whole module would give
    every other node the type it already has: the rebuilt nodes (:func:`~relay_tasks.ir.
    with_children`) keep theirs, and each relation sees the same argument types. Typing only
    the new constants saves that pass: 12 ms of the ONNX BERT's last fold, 40 ms on a ResNet-50
    from ONNX. A shape whose dimensions were typed as 64-bit integers (a constant's are 32-bit)
    is not the same type: those modules are typed again in full.
    """
    for const, replaced in made:
        if replaced is None:
            return False
        if not tvm.ir.structural_equal(relay.transform.InferTypeLocal(const), replaced):
            return False
    return True


def only_typed(mod: tvm.IRModule, made: Sequence[tuple[relay.Constant, Any]]) -> tvm.IRModule:
    """What TVM's FoldConstant returns for a module it finds nothing to rewrite in: each function
    as the numpy folder left it (``made``: the constants it put in), then the module typed, as
    every Relay function pass ends. Re-typing is saved where the module is already typed and
    the new constants can be typed in place (:func:`typed_in_place`); a quarter of a
    transformer's extraction was TVM's pass compiling the one integer add the folder left it."""
    if _typed(mod) and typed_in_place(made):
        return mod
    return relay.transform.InferType()(mod)


def _typed(mod: tvm.IRModule) -> bool:
    """Whether every Relay function of ``mod`` is typed: type inference ran on it, or it was
    rebuilt from one it ran on (``WithFields`` keeps each node's type) with every node it added
    typed in place (nodes are immutable, so a typed function stays typed)."""
    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            try:
                func.checked_type  # noqa: B018 (raises when the function was never typed)
            except ValueError:
                return False
    return True


def _tvm_rewrites_node(node: Any) -> bool:
    """A non-call node TVM's FoldConstant may rewrite: a ``let`` (constants are inlined), an
    ``if`` (a constant condition picks a branch), a projection of a tuple literal."""
    if isinstance(node, (relay.Let, relay.If)):
        return True
    return isinstance(node, relay.TupleGetItem) and isinstance(node.tuple_value, relay.Tuple)


# The pass decorator replaces the class, which mutation tools cannot instrument: the work is in
# fold_module.
@tvm.transform.module_pass(opt_level=2, name="FoldConstant")
class FoldConstant:  # pragma: no mutate block
    """Drop-in for ``relay.transform.FoldConstant()``: numpy first, TVM for what remains.

    Inside :func:`deferred_placeholders`, large results are deferred (see
    :func:`prefold_function`), unless FuseOps will link constants into the fused functions
    (``relay.FuseOps.link_params``).
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fold_module(mod, ctx)
