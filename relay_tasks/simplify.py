"""``SimplifyExpr``, ``SimplifyExprPostAlterOp`` and ``qnn.Legalize``, skipped when they provably
change nothing.

Both passes run a list of pattern rewrites to a fixed point, type-checking the whole graph and
regrouping pattern matches once per rewrite per round: about 4 s of a 10 s ResNet-50 pipeline,
usually to change nothing at all. Each rewrite changes the graph only at a call of a particular
shape (``reshape(reshape(x))``, ``add(x, x)``, ``x * 1``, ...). Here a cheap, deliberately
over-inclusive test of every call asks "could any rewrite fire here?"; if no call says yes, the
pass would return the graph unchanged and is skipped, otherwise the real pass runs. A test runs the
real passes wherever the screen says "no" and checks that they change nothing. ``qnn.Legalize``
rewrites only ``qnn.*`` calls, yet type-checks and rebuilds the whole graph (weights included)
on float models too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import tvm
from tvm import relay

Screen = Callable[[relay.Call], bool]

_RESHAPES = frozenset({"reshape", "contrib_reverse_reshape"})
_TRANSPOSES = frozenset({"transpose", "layout_transform"})
_CASTS = frozenset({"cast", "cast_like"})
_FILLS = frozenset({"zeros", "zeros_like", "ones", "ones_like", "full", "full_like"})
#: Ops that some rewrite acts on whenever they occur (the ``*_like`` concretisations, fills).
_ALWAYS = _FILLS | {
    "reshape_like",
    "collapse_sum_like",
    "broadcast_to_like",
    "cast_like",
}
_IDENTITY_VALUE = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "divide": 1.0}


def _op_name(expr: Any) -> str:
    if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
        return str(expr.op.name)
    return ""


def _same(a: Any, b: Any) -> bool:
    return bool(a.same_as(b))


def _scalar_value(expr: Any) -> float | None:
    """The value of a one-element constant (any shape of ones), else None."""
    if isinstance(expr, relay.Constant) and int(np.prod(expr.data.shape)) == 1:
        value = expr.data.numpy().reshape(())
        if value.dtype.kind in "fiub":
            return float(value)
    return None


def _consecutive(first: frozenset[str], second: frozenset[str]) -> Screen:
    """``first(second(x))``: consecutive reshapes, transposes or casts."""
    return lambda call: _op_name(call) in first and _op_name(call.args[0]) in second


def _always(call: relay.Call) -> bool:
    return _op_name(call) in _ALWAYS


def _identity_operand(call: relay.Call) -> bool:
    """x + 0, x - 0, x * 1, x / 1 (either side, scalar constants or fill ops)."""
    want = _IDENTITY_VALUE.get(_op_name(call))
    if want is None:
        return False
    return any(_op_name(arg) in _FILLS or _scalar_value(arg) == want for arg in call.args)


def _noop_transpose(call: relay.Call) -> bool:
    name = _op_name(call)
    if name == "layout_transform":
        return str(call.attrs.src_layout) == str(call.attrs.dst_layout)
    if name == "transpose":
        axes = call.attrs.axes
        ndim = len(call.checked_type.shape)
        if axes is None:
            return ndim <= 1
        return [int(a) % ndim for a in axes] == list(range(ndim))
    return False


def _same_cast(call: relay.Call) -> bool:
    if _op_name(call) != "cast":
        return False
    return str(call.attrs.dtype) == str(call.args[0].checked_type.dtype)


def _clip_covers_dtype(call: relay.Call) -> bool:
    """A clip whose bounds are (within 1 of) its dtype's whole range is removed."""
    if _op_name(call) != "clip":
        return False
    dtype = str(call.checked_type.dtype)
    info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
    lo, hi = float(call.attrs.a_min), float(call.attrs.a_max)
    return abs(hi - float(info.max)) <= 1 and abs(lo - float(info.min)) <= 1


def _cast_of_clip_or_cast(call: relay.Call) -> bool:
    return _op_name(call) == "cast" and _op_name(call.args[0]) in {"clip", "cast"}


def _constant_pair(call: relay.Call, inner_ops: frozenset[str]) -> bool:
    """``outer(inner(x, c1), c2)`` with constants c1, c2, in any argument order."""
    args = list(call.args)
    if len(args) != 2:
        return False
    return any(
        isinstance(other, relay.Constant)
        and _op_name(inner) in inner_ops
        and any(isinstance(a, relay.Constant) for a in inner.args)
        for inner, other in (args, args[::-1])
    )


def _switch_add_multiply(call: relay.Call) -> bool:
    return _op_name(call) == "multiply" and _constant_pair(call, frozenset({"add"}))


def _adjacent_multiply_or_add(call: relay.Call) -> bool:
    name = _op_name(call)
    return name in ("add", "multiply") and _constant_pair(call, frozenset({name}))


def _add_self(call: relay.Call) -> bool:
    return _op_name(call) == "add" and _same(call.args[0], call.args[1])


def _binomial_square(call: relay.Call) -> bool:
    """A square ``x * x`` or ``x * (a * x)``: every binomial pattern needs one."""
    if _op_name(call) != "multiply":
        return False
    left, right = call.args
    if _same(left, right):
        return True
    for outer, inner in ((left, right), (right, left)):
        if _op_name(inner) == "multiply" and any(_same(outer, a) for a in inner.args):
            return True
    return False


def _divide_by_sqrt(call: relay.Call) -> bool:
    return _op_name(call) == "divide" and _op_name(call.args[1]) == "sqrt"


def _arg_of_dequantize(call: relay.Call) -> bool:
    return _op_name(call) in {"argmax", "argmin", "argsort"} and (
        _op_name(call.args[0]) == "qnn.dequantize"
    )


#: One screen per rewrite of upstream's SimplifyExpr.
SIMPLIFY_EXPR_SCREENS: tuple[Screen, ...] = (
    _always,  # Concretize*Like (zeros, ones, full, reshape, collapse_sum...), FullElementwise
    _add_self,  # SimplifyAdd
    _divide_by_sqrt,  # SimplifyRSqrt
    _identity_operand,  # EliminateIdentity
    _consecutive(_RESHAPES, _RESHAPES),  # SimplifyReshape
    _consecutive(_TRANSPOSES, _TRANSPOSES),  # SimplifyTranspose
    _noop_transpose,  # SimplifyNoOpTranspose
    _same_cast,  # SimplifySameCast
    _consecutive(_CASTS, _CASTS),  # SimplifyConsecutiveCast
    _switch_add_multiply,  # SwitchAddMultiply
    _adjacent_multiply_or_add,  # SimplifyAdjacentMultiplyOrAdd
    _arg_of_dequantize,  # SimplifyDQArg{Max,Min,Sort}
    _cast_of_clip_or_cast,  # SimplifyClipAndConsecutiveCast
    _clip_covers_dtype,  # SimplifyClip
    _binomial_square,  # SimplifyBinomial
)

#: One screen per rewrite of upstream's SimplifyExprPostAlterOp.
POST_ALTER_OP_SCREENS: tuple[Screen, ...] = (
    _always,  # the fill ops that EliminateIdentity accepts as zeros/ones
    _identity_operand,  # EliminateIdentity
    _consecutive(_RESHAPES, _RESHAPES),  # SimplifyReshape
    _same_cast,  # SimplifySameCast
    _consecutive(_CASTS, _CASTS),  # SimplifyConsecutiveCast
    _cast_of_clip_or_cast,  # SimplifyClipAndConsecutiveCast
    _clip_covers_dtype,  # SimplifyClip
)


def might_rewrite(mod: tvm.IRModule, screens: Iterable[Screen]) -> bool:
    """Whether any screened rewrite could change a call in any Relay function of ``mod``."""
    calls: list[relay.Call] = []

    def collect(node: Any) -> None:
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            calls.append(node)

    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, collect)
    checks = tuple(screens)
    try:
        return any(check(call) for call in calls for check in checks)
    except (ValueError, TypeError, AttributeError, tvm.TVMError):
        return True  # an untyped or unusual call: let the real pass decide


def _screened(
    name: str,
    real: Callable[[], tvm.transform.Pass],
    screens: tuple[Screen, ...],
    required: tuple[str, ...] = ("InferType",),
) -> Any:
    @tvm.transform.module_pass(opt_level=0, name=name, required=list(required))  # type: ignore[untyped-decorator]
    def screened(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return real()(mod) if might_rewrite(mod, screens) else mod

    return screened


def SimplifyExpr() -> tvm.transform.Pass:
    """``relay.transform.SimplifyExpr()``, skipped where it would change nothing."""
    return _screened("SimplifyExpr", relay.transform.SimplifyExpr, SIMPLIFY_EXPR_SCREENS)


def SimplifyExprPostAlterOp() -> tvm.transform.Pass:
    """``SimplifyExprPostAlterOp``, skipped where it would change nothing."""
    real = tvm.get_global_func("relay._transform.SimplifyExprPostAlterOp")
    return _screened("SimplifyExprPostAlterOp", real, POST_ALTER_OP_SCREENS)


#: qnn.Legalize lowers qnn ops (QnnLegalize, then QnnCanonicalize) and touches nothing else.
QNN_LEGALIZE_SCREENS: tuple[Screen, ...] = (lambda call: _op_name(call).startswith("qnn."),)


def QnnLegalize() -> tvm.transform.Pass:
    """C++'s ``qnn.Legalize``, skipped on models without qnn ops."""
    real = tvm.get_global_func("relay.qnn._transform.Legalize")
    return _screened("qnn.Legalize", real, QNN_LEGALIZE_SCREENS, required=())
