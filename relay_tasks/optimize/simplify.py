"""``SimplifyExpr`` and ``SimplifyExprPostAlterOp``, skipped when they provably change nothing.

Both passes run a list of pattern rewrites to a fixed point, type-checking the whole graph and
regrouping pattern matches once per rewrite per round: about 4 s of a 10 s ResNet-50 pipeline,
usually to change nothing at all. Each rewrite changes the graph only at a call of a particular
shape (``reshape(reshape(x))``, ``add(x, x)``, ``x * 1``, ...). Here a cheap, deliberately
over-inclusive test of every call asks "could any rewrite fire here?"; if no call says yes, the
pass would return the graph unchanged and is skipped, otherwise the real pass runs. A test runs the
real passes wherever the screen says "no" and checks that they change nothing.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relay
from tvm.relay.dataflow_pattern import DFPatternCallback, is_constant, is_op, rewrite, wildcard

from ..ir import (
    FunctionReads,
    call_parts,
    callee_name,
    node_key,
    raw_data,
    reads_of,
    rebuild,
    stand_in,
    with_functions,
)
from .fold import array_view, folded_call
from .placeholders import fill
from .region import COMPUTED, run_on_region

Check = Callable[[relay.Call], bool]

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


#: During one screening walk, the reads of the function walked: several screens look at the
#: same call and its arguments, and every field read goes through TVM's FFI.
_READS: ContextVar[FunctionReads | None] = ContextVar("relay_tasks_screen_reads", default=None)


def _op_name(expr: Any) -> str:
    """The op a call calls ("" for anything else), read once per walk."""
    reads = _READS.get()
    if reads is not None:
        return reads.op_name(expr)
    return callee_name(expr.op) if isinstance(expr, relay.Call) else ""


def _args(call: relay.Call) -> list[Any]:
    """A call's arguments, read once per walk."""
    reads = _READS.get()
    return reads.args(call) if reads is not None else call_parts(call)[1]


def _same(a: Any, b: Any) -> bool:
    return bool(a.same_as(b))


def _scalar_value(expr: Any) -> float | None:
    """The value of a one-element constant (any shape of ones), else None. (Read through DLPack
    and sized with ``math.prod``: ``NDArray.numpy()`` and ``np.prod`` cost 12 us and 3 us, on
    every constant operand of every add and multiply the screens look at.)"""
    if not isinstance(expr, relay.Constant):
        return None
    data = expr.data
    if math.prod(data.shape) != 1:
        return None
    value = array_view(data).reshape(())
    return float(value) if value.dtype.kind in "fiub" else None


@dataclass(frozen=True)
class Screen:
    """A cheap, over-inclusive test for one rewrite of a pass: could it fire at this call?"""

    rewrite: str  # the upstream rewrite it stands for
    roots: frozenset[str] | None  # ops a match can be rooted at (None: any op)
    check: Check

    def __call__(self, call: relay.Call) -> bool:
        return self.check(call)


def _consecutive(first: frozenset[str], second: frozenset[str]) -> Check:
    """``first(second(x))``: consecutive reshapes, transposes or casts."""
    return lambda call: _op_name(call) in first and _op_name(_args(call)[0]) in second


def _always(call: relay.Call) -> bool:
    return _op_name(call) in _ALWAYS


def _identity_operand(call: relay.Call) -> bool:
    """x + 0, x - 0, x * 1, x / 1 (scalar constants or fill ops; either side of the commutative
    add and multiply only: TVM's matcher swaps arguments for those two alone)."""
    name = _op_name(call)
    want = _IDENTITY_VALUE.get(name)
    if want is None:
        return False
    operands = _args(call) if name in ("add", "multiply") else _args(call)[1:]
    return any(_op_name(arg) in _FILLS or _scalar_value(arg) == want for arg in operands)


def _noop_layout_transform(call: relay.Call) -> bool:
    if _op_name(call) != "layout_transform":
        return False
    return str(call.attrs.src_layout) == str(call.attrs.dst_layout)


def _noop_transpose(call: relay.Call) -> bool:
    if _op_name(call) != "transpose":
        return False
    order = _transpose_order(call)
    return order == list(range(len(order)))


def _transpose_order(call: relay.Call) -> list[int]:
    """Which input axis each output axis of a ``transpose`` call is (no axes: reversed)."""
    axes = call.attrs.axes
    ndim = len(call.checked_type.shape)
    if axes is None:
        return list(range(ndim))[::-1]
    if len(axes) != ndim:
        raise ValueError(f"a transpose of rank {ndim} with {len(axes)} axes")  # TVM's to judge
    return [int(a) % ndim for a in axes]


def _transpose_of_layout_transform(call: relay.Call) -> bool:
    """A transpose pair in which a ``layout_transform`` takes part (TVM's pass merges those)."""
    return (
        _op_name(call) in _TRANSPOSES
        and _op_name(_args(call)[0]) in _TRANSPOSES
        and ("layout_transform" in (_op_name(call), _op_name(_args(call)[0])))
    )


def _same_cast(call: relay.Call) -> bool:
    if _op_name(call) != "cast":
        return False
    return str(call.attrs.dtype) == str(_args(call)[0].checked_type.dtype)


def _clip_covers_dtype(call: relay.Call) -> bool:
    """A clip whose bounds are (within 1 of) its dtype's whole range is removed."""
    if _op_name(call) != "clip":
        return False
    dtype = str(call.checked_type.dtype)
    info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
    lo, hi = float(call.attrs.a_min), float(call.attrs.a_max)
    return abs(hi - float(info.max)) <= 1 and abs(lo - float(info.min)) <= 1


def _cast_of_clip_or_cast(call: relay.Call) -> bool:
    return _op_name(call) == "cast" and _op_name(_args(call)[0]) in {"clip", "cast"}


def _constant_pair(call: relay.Call, inner_ops: frozenset[str]) -> bool:
    """``outer(inner(x, c1), c2)`` with constants c1, c2, in any argument order."""
    args = _args(call)
    if len(args) != 2:
        return False
    return any(
        isinstance(other, relay.Constant)
        and _op_name(inner) in inner_ops
        and any(isinstance(a, relay.Constant) for a in _args(inner))
        for inner, other in (args, args[::-1])
    )


def _switch_add_multiply(call: relay.Call) -> bool:
    return _op_name(call) == "multiply" and _constant_pair(call, frozenset({"add"}))


def _adjacent_multiply_or_add(call: relay.Call) -> bool:
    name = _op_name(call)
    return name in ("add", "multiply") and _constant_pair(call, frozenset({name}))


def _add_self(call: relay.Call) -> bool:
    return _op_name(call) == "add" and _same(*_args(call))


def _binomial_square(call: relay.Call) -> bool:
    """A square ``x * x`` or ``x * (a * x)``: every binomial pattern needs one."""
    if _op_name(call) != "multiply":
        return False
    left, right = _args(call)
    if _same(left, right):
        return True
    for outer, inner in ((left, right), (right, left)):
        if _op_name(inner) == "multiply" and any(_same(outer, a) for a in _args(inner)):
            return True
    return False


_ARG_OPS = ("argmax", "argmin", "argsort")


def _arg_of_dequantize(call: relay.Call) -> bool:
    return _op_name(call) in _ARG_OPS and (_op_name(_args(call)[0]) == "qnn.dequantize")


_ARITH = frozenset(_IDENTITY_VALUE)
_ADD, _MULTIPLY = frozenset({"add"}), frozenset({"multiply"})
_ADD_OR_MULTIPLY = _ADD | _MULTIPLY
_ALWAYS_SCREEN = Screen("Concretize*Like, FullElementwise", _ALWAYS, _always)
_IDENTITY_SCREEN = Screen("EliminateIdentity", _ARITH, _identity_operand)
_RESHAPE_SCREEN = Screen("SimplifyReshape", _RESHAPES, _consecutive(_RESHAPES, _RESHAPES))
_SAME_CAST_SCREEN = Screen("SimplifySameCast", frozenset({"cast"}), _same_cast)
_CAST_CAST_SCREEN = Screen("SimplifyConsecutiveCast", _CASTS, _consecutive(_CASTS, _CASTS))
_CAST_CLIP_SCREEN = Screen(
    "SimplifyClipAndConsecutiveCast", frozenset({"cast"}), _cast_of_clip_or_cast
)
_CLIP_SCREEN = Screen("SimplifyClip", frozenset({"clip"}), _clip_covers_dtype)
_ADJACENT_SCREEN = Screen(
    "SimplifyAdjacentMultiplyOrAdd", _ADD_OR_MULTIPLY, _adjacent_multiply_or_add
)
_TRANSPOSE, _LAYOUT = frozenset({"transpose"}), frozenset({"layout_transform"})
_TRANSPOSE_SCREEN = Screen("SimplifyTranspose", _TRANSPOSE, _consecutive(_TRANSPOSE, _TRANSPOSE))
_NOOP_TRANSPOSE_SCREEN = Screen("SimplifyNoOpTranspose", _TRANSPOSE, _noop_transpose)

#: One screen per rewrite of upstream's SimplifyExpr.
SIMPLIFY_EXPR_SCREENS: tuple[Screen, ...] = (
    _ALWAYS_SCREEN,
    Screen("SimplifyAdd", _ADD, _add_self),
    _IDENTITY_SCREEN,
    _RESHAPE_SCREEN,
    _TRANSPOSE_SCREEN,
    Screen("SimplifyTranspose (layout_transform)", _TRANSPOSES, _transpose_of_layout_transform),
    _NOOP_TRANSPOSE_SCREEN,
    Screen("SimplifyNoOpTranspose (layout_transform)", _LAYOUT, _noop_layout_transform),
    _SAME_CAST_SCREEN,
    _CAST_CAST_SCREEN,
    Screen("SwitchAddMultiply", _MULTIPLY, _switch_add_multiply),
    _ADJACENT_SCREEN,
    Screen("SimplifyDQArg{Max,Min,Sort}", frozenset(_ARG_OPS), _arg_of_dequantize),
    _CAST_CLIP_SCREEN,
    _CLIP_SCREEN,
    Screen("SimplifyBinomial", _MULTIPLY, _binomial_square),
)

#: One screen per rewrite of upstream's SimplifyExprPostAlterOp.
POST_ALTER_OP_SCREENS: tuple[Screen, ...] = (
    _ALWAYS_SCREEN,  # the fill ops that EliminateIdentity accepts as zeros/ones
    _IDENTITY_SCREEN,
    _RESHAPE_SCREEN,
    _SAME_CAST_SCREEN,
    _CAST_CAST_SCREEN,
    _CAST_CLIP_SCREEN,
    _CLIP_SCREEN,
)


def might_rewrite(mod: tvm.IRModule, screens: Iterable[Screen]) -> bool:
    """Whether any screened rewrite could change a call in any Relay function of ``mod``."""
    return _any_flagged(_flagged_by_function(mod, tuple(screens)))


def _any_flagged(flagged: dict[Any, list[relay.Call] | None]) -> bool:
    return any(calls is None or calls for calls in flagged.values())


def _flagged_by_function(
    mod: tvm.IRModule, screens: tuple[Screen, ...]
) -> dict[Any, list[relay.Call] | None]:
    """Flagged calls per Relay function (None: a call the screens could not judge)."""
    flagged: dict[Any, list[relay.Call] | None] = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relay.Function):
            try:
                flagged[gvar] = flagged_calls(func, screens)
            except (ValueError, TypeError, AttributeError, tvm.TVMError):
                flagged[gvar] = None  # an untyped or unusual call: let the real pass decide
    return flagged


def flagged_calls(func: relay.Function, screens: Iterable[Screen]) -> list[relay.Call]:
    """The calls of ``func`` where some screened rewrite could fire.

    Each call's op is read once and only the screens rooted at it run: reading a Relay node's
    fields goes through TVM's FFI, and most calls of a model (convolutions, matmuls) concern no
    screen at all.
    """
    reads = reads_of(func)
    token = _READS.set(reads)
    try:
        return flagged_calls_among(reads.nodes, screens)
    finally:
        _READS.reset(token)


def flagged_calls_among(nodes: Iterable[Any], screens: Iterable[Screen]) -> list[relay.Call]:
    """The calls among ``nodes`` where some screened rewrite could fire."""
    by_root: dict[str, list[Screen]] = {}
    anywhere: list[Screen] = []
    for screen in screens:
        for root in screen.roots or ():
            by_root.setdefault(root, []).append(screen)
        if screen.roots is None:
            anywhere.append(screen)
    calls: list[relay.Call] = []
    for node in nodes:
        name = _op_name(node)
        if name and any(screen(node) for screen in by_root.get(name, []) + anywhere):
            calls.append(node)
    return calls


#: Rounds of local rewriting before the whole graph goes to TVM after all.
_LOCAL_ROUNDS = 4


def simplify_locally(
    mod: tvm.IRModule,
    real: Callable[[], tvm.transform.Pass],
    screens: tuple[Screen, ...],
    flagged: dict[Any, list[relay.Call] | None] | None = None,
) -> tvm.IRModule | None:
    """``real`` run around the flagged calls only (see :mod:`relay_tasks.optimize.region`), or
    our own rewrites where they are all that is flagged (:data:`_OWN_REWRITES`), round after round,
    until no call is flagged; None when that does not settle it.

    A graph in which no screen flags a call is a fixed point of every rewrite of the pass, so
    the pass on the whole graph would stop there too: the rewrites are local, each one here is
    TVM's own, and applying them in another order reaches the same fixed point (checked against
    the whole-graph pass on every model and on random graphs in the tests). A flagged call left
    unchanged (the screens over-include) sends the whole graph to TVM, as before, and so does
    an ``add(x, x)`` that :func:`_duplicates_below`.
    """
    for _ in range(_LOCAL_ROUNDS):
        if flagged is None:
            flagged = _flagged_by_function(mod, screens)
        updates = {}
        settled = typed = True
        for gvar, calls in flagged.items():
            if calls is None or _duplicates_below(mod[gvar], calls):
                return None
            if calls:
                own = _own_rewrites(calls, screens)
                if own:
                    new = _rewritten(mod[gvar], own)
                    if new is None:
                        return None
                    replaced = [pair for callback in own for pair in callback.replaced]
                    settled = (
                        settled
                        and _typed_alone(replaced)
                        and not _flags_near(mod[gvar], replaced, calls, screens)
                    )
                    typed = typed and settled and _kept_types(replaced)
                else:
                    new = run_on_region(mod[gvar], calls, _filled(real()))
                    if new is None:
                        return None
                    settled = False
                updates[gvar] = new
        if not updates:
            return mod
        if settled and typed:
            return with_functions(mod, updates)
        mod = relay.transform.InferType()(with_functions(mod, updates))
        if settled:
            return mod
        flagged = None
    return None


def _duplicates_below(func: relay.Function, calls: list[relay.Call]) -> bool:
    """Whether a flagged ``add(x, x)`` has below it a node that other calls use too: TVM's
    ``SimplifyAdd`` builds its ``multiply(x, 2)`` on the ``x`` it matched before the round
    rebuilt the graph, so the whole graph comes out with each such node computed twice (which
    FuseOps then sees), and a cut, which ends above them, cannot show that."""
    adds = [call for call in calls if _add_self(call)]
    if not adds:
        return False
    reads = reads_of(func)
    users = _users(reads)
    for add in adds:
        below: set[int] = set()
        stack = [_args(add)[0]]
        while stack:
            node = stack.pop()
            if node_key(node) in below or not isinstance(node, COMPUTED):
                continue
            below.add(node_key(node))
            stack += reads.children(node) or ()
        inside = below | {node_key(add)}
        if any(node_key(u) not in inside for key in below for u in users.get(key, ())):
            return True
    return False


def _users(reads: FunctionReads) -> dict[int, list[Any]]:
    """Each node's users in a function, by the node's key."""
    users: dict[int, list[Any]] = {}
    for node in reads.nodes:
        for child in reads.children(node) or ():
            users.setdefault(node_key(child), []).append(node)
    return users


#: How far above a rewritten call a screen's answer can change: a screen reads a call, its
#: arguments and their arguments; one more for a tuple in between.
_SCREEN_DEPTH = 3


def _flags_near(
    func: relay.Function,
    replaced: list[tuple[relay.Expr, relay.Expr]],
    flagged: list[relay.Call],
    screens: tuple[Screen, ...],
) -> bool:
    """Whether a screen could flag a call of ``func`` after our rewrites replaced each old node of
    ``replaced`` by its new one, typed (:func:`_typed_alone`): True when it cannot tell.

    Saves screening the whole re-typed function again (13 ms of the ONNX BERT's 0.18 s): a
    screen's answer at a call depends only on the nodes up to :data:`_SCREEN_DEPTH` below it
    and their types, and the rewrites keep every type. So only the replacements, the calls that
    were flagged (a screen over-includes), and the old nodes above a replaced one up to that
    depth can answer otherwise; each is screened as it is after the rewrites (an old node
    rebuilt over the new arguments, keeping its type; a replacement typed alone). The matcher
    may rewrite what it made (a chain of reshapes): a replacement of a node that ``func`` does
    not hold makes the answer True.
    """
    reads = reads_of(func)
    keys = {node_key(node) for node in reads.nodes}
    if any(node_key(old) not in keys for old, _ in replaced):
        return True
    users = _users(reads)
    new: dict[int, Any] = {node_key(old): node for old, node in replaced}
    near: set[int] = {node_key(call) for call in flagged}
    frontier = set(new)
    for _ in range(_SCREEN_DEPTH):
        frontier = {node_key(user) for key in frontier for user in users.get(key, ())}
        near |= frontier
    for node in reads.nodes:
        key = node_key(node)
        if key in near and key not in new:
            rebuilt = rebuild(node, lambda child: new.get(node_key(child), child))
            if rebuilt is None:
                return True
            new[key] = rebuilt
    return bool(flagged_calls_among(new.values(), screens))


def _filled(real: tvm.transform.Pass) -> Callable[[tvm.IRModule], tvm.IRModule]:
    """``real`` on a cut whose deferred constants it may read are computed first (see
    :func:`fill_what_simplify_reads`)."""
    return lambda cut: real(fill_what_simplify_reads(cut))


#: (outer, inner) op pairs whose constants SimplifyExpr folds together with TVM's evaluator:
#: ``(x * c1) * c2``, ``(x + c1) + c2``, ``(x + c1) * c2``; and the binomial rewrite reads the
#: constant factors of ``a * (x * x)``.
_FOLDED_TOGETHER = frozenset({("add", "add"), ("multiply", "multiply"), ("multiply", "add")})


def fill_what_simplify_reads(mod: tvm.IRModule) -> tvm.IRModule:
    """Compute the deferred constants of ``mod`` that TVM's SimplifyExpr rewrites read: every
    constant of one element (the identity and binomial rewrites read scalars), and the
    constants of the op pairs in :data:`_FOLDED_TOGETHER`; returns ``mod``.

    Its other rewrites read types and attributes only. Filling nothing more matters where a
    deferred value needs TVM's kernels (a T5's position buckets go through ``log``): a cut
    holding ``scores + position_bias`` would otherwise build them to read nothing.
    """

    def visit(node: Any) -> None:
        if isinstance(node, relay.Constant):
            if all(int(d) == 1 for d in raw_data(node).shape):
                fill(node)
        elif isinstance(node, relay.Call) and callee_name(node.op) in ("add", "multiply"):
            for arg in node.args:
                inner = callee_name(arg.op) if isinstance(arg, relay.Call) else ""
                if (callee_name(node.op), inner) in _FOLDED_TOGETHER:
                    for operand in (*node.args, *arg.args):
                        if isinstance(operand, relay.Constant):
                            fill(operand)

    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)
    return mod


def _own_rewrites(calls: list[relay.Call], screens: tuple[Screen, ...]) -> list[Any] | None:
    """Our callbacks for the rewrites that could fire at the flagged ``calls`` (in the pass's
    order), or None when some call could be rewritten by another of the pass's rewrites."""
    fired: set[str] = set()
    for call in calls:
        for screen in screens:
            if (screen.roots is None or _op_name(call) in screen.roots) and screen(call):
                if screen.rewrite not in _OWN_REWRITES:
                    return None
                fired.add(screen.rewrite)
    factories = dict.fromkeys(_OWN_REWRITES[s.rewrite] for s in screens if s.rewrite in fired)
    return [factory() for factory in factories]


class _ReshapePair(DFPatternCallback):  # type: ignore[misc]
    """TVM's ``SimplifyReshape`` rewrite: a reshape (or reverse reshape) of one becomes a single
    reshape of the inner input to the outer call's static shape (its dims as typed, so their
    integer width too; no ``allowzero``), as ``MakeReshape`` builds it."""

    def __init__(self) -> None:
        super().__init__(require_type=False)
        self.replaced: list[tuple[relay.Expr, relay.Expr]] = []
        self.x = wildcard()
        # Two patterns, not one used twice: the matcher binds a pattern node to one op.
        outer, inner = (is_op("reshape") | is_op("contrib_reverse_reshape") for _ in range(2))
        self.pattern = outer(inner(self.x))

    def callback(self, pre: relay.Call, post: relay.Call, node_map: Any) -> relay.Expr:
        try:
            dims = list(pre.checked_type.shape)
        except ValueError:  # a pair with a reshape made here: merged next round, once typed
            return post
        if not all(isinstance(d, tvm.tir.IntImm) for d in dims):
            return post
        attrs = tvm.ir.make_node("relay.attrs.ReshapeAttrs", newshape=dims, allowzero=False)
        return _replacing(self, pre, tvm.ir.Op.get("reshape"), [node_map[self.x][0]], attrs)


class _TransposePair(DFPatternCallback):  # type: ignore[misc]
    """TVM's ``SimplifyTranspose`` and ``SimplifyNoOpTranspose`` rewrites where only ``transpose``
    calls take part: a transpose of a transpose becomes one transpose of the inner input, its
    axes the two orders composed, and a transpose that keeps every axis where it is becomes
    its input (which the pass reaches in two steps: the merged transpose, then its removal)."""

    def __init__(self) -> None:
        super().__init__(require_type=False)
        self.replaced: list[tuple[relay.Expr, relay.Expr]] = []
        self.x = wildcard()
        inner = is_op("transpose")(self.x)
        self.pattern = is_op("transpose")(inner) | is_op("transpose")(self.x)

    def callback(self, pre: relay.Call, post: relay.Call, node_map: Any) -> relay.Expr:
        try:
            outer = _transpose_order(pre)
            inner = pre.args[0]
            pair = _op_name(inner) == "transpose"
            order = [_transpose_order(inner)[axis] for axis in outer] if pair else outer
        except ValueError:  # a transpose made here: merged next round, once typed
            return post
        x = node_map[self.x][0]
        if order == list(range(len(order))):
            self.replaced.append((pre, x))
            return x
        if not pair:
            return post
        return _replacing(self, pre, pre.op, [x], _transpose_attrs(order))


def _transpose_attrs(order: list[int]) -> Any:
    """A ``transpose``'s attributes as ``MakeTranspose`` builds them."""
    return relay.transpose(relay.var("x", shape=[1] * len(order)), order).attrs


class _AdjacentConstants(DFPatternCallback):  # type: ignore[misc]
    """TVM's ``SimplifyAdjacentMultiplyOrAdd`` rewrite: ``(x * c1) * c2`` becomes
    ``x * (c1 * c2)``, and the same for ``add`` (in any argument order: the matcher swaps the
    arguments of these two ops), unless ``x`` is a constant too. ``c1 * c2`` is computed as TVM's
    fold computes it, in numpy where an evaluator covers it (TVM compiled it with LLVM: 50 ms,
    most of a BERT's simplification)."""

    def __init__(self) -> None:
        super().__init__(require_type=False)
        self.replaced: list[tuple[relay.Expr, relay.Expr]] = []
        self.x, self.c1, self.c2 = wildcard(), is_constant(), is_constant()
        self.pattern = (self.x * self.c1 * self.c2) | (self.x + self.c1 + self.c2)

    def callback(self, pre: relay.Call, post: relay.Call, node_map: Any) -> relay.Expr:
        x = node_map[self.x][0]
        if isinstance(x, relay.Constant):
            return post
        constants = relay.Call(pre.op, [node_map[self.c1][0], node_map[self.c2][0]])
        return _replacing(self, pre, pre.op, [x, folded_call(constants)])


def _replacing(
    callback: Any, old: relay.Expr, op: tvm.ir.Op, args: list[Any], attrs: Any = None
) -> relay.Call:
    """The call of ``op`` on ``args`` that replaces ``old``, noted (see :func:`_flags_near`) and
    given the type arguments type inference gives an op's call, its arguments' types, where
    they are known (see :func:`_kept_types`)."""
    types = _argument_types(args)
    new = relay.Call(op, args, attrs, types)
    if types is not None:
        # Typed now, not after the rewrite: a later rewrite below it copies this node into its
        # consumer's new arguments, and the copy keeps only the type it had then.
        with contextlib.suppress(tvm.TVMError):
            relay.transform.InferTypeLocal(new)
    callback.replaced.append((old, new))
    return new


def _argument_types(args: list[Any]) -> list[Any] | None:
    """Each argument's type, a new constant typed in place; None if an argument is untyped."""
    types = []
    for arg in args:
        try:
            types.append(arg.checked_type)
        except ValueError:
            if not isinstance(arg, relay.Constant):
                return None  # a call made earlier in the rewrite
            types.append(relay.transform.InferTypeLocal(arg))
    return types


def _typed_alone(replaced: list[tuple[relay.Expr, relay.Expr]]) -> bool:
    """Type each replacement in place from its arguments' types; False if one cannot be. A
    replacement that is the old call's own argument (a no-op transpose removed) is typed
    already, and is left alone: typing a node of the module in place, outside the module (a
    call of a Prelude function, say), breaks it (a segfault in a later pass, found by the
    fuzz test)."""
    try:
        for old, new in replaced:
            if any(new.same_as(arg) for arg in old.args):
                continue
            relay.transform.InferTypeLocal(new)
    except tvm.TVMError:
        return False
    return True


def _kept_types(replaced: list[tuple[relay.Expr, relay.Expr]]) -> bool:
    """Whether each replacement, typed (:func:`_typed_alone`), has the type of the node it
    replaced and its arguments' types as type arguments: then type inference over
    the module would leave every node's type as it is (the matcher's rebuilt nodes keep theirs,
    and each relation sees the same argument types), and is skipped (10 ms of the ONNX BERT's
    simplification, 13 ms of GPT-2's)."""
    for old, new in replaced:
        if isinstance(new, relay.Call) and len(new.type_args) != len(new.args):
            return False
        if not tvm.ir.structural_equal(new.checked_type, old.checked_type):
            return False
    return True


#: The rewrites done here rather than by TVM's pass, by the name of the screen for each: where
#: a screen flags nothing else, these alone do the pass's work, on the whole function (TVM's
#: matcher walks it in C++ and calls back at the matches only; nothing is typed in between): 11 ms
#: on GPT-2's twelve reshape pairs, against 40 ms for the pass's two dozen rewrites on a cut, each
#: re-typing it, and the cut's own cost. What they enable is flagged in the next round.
_OWN_REWRITES: dict[str, Callable[[], Any]] = {
    _RESHAPE_SCREEN.rewrite: _ReshapePair,
    _ADJACENT_SCREEN.rewrite: _AdjacentConstants,
    _TRANSPOSE_SCREEN.rewrite: _TransposePair,
    _NOOP_TRANSPOSE_SCREEN.rewrite: _TransposePair,
}


def _rewritten(func: relay.Function, callbacks: list[Any]) -> relay.Function | None:
    """``func`` rewritten by our ``callbacks`` (see :data:`_OWN_REWRITES`), untyped; None when
    they change nothing, so that the caller hands the graph to the real pass."""
    rewritten = rewrite(callbacks, func)
    return None if rewritten.same_as(func) else rewritten


def _screened(real: Callable[[], tvm.transform.Pass], screens: tuple[Screen, ...]) -> Any:
    def screened(mod: tvm.IRModule) -> tvm.IRModule:
        flagged = _flagged_by_function(mod, screens)
        if not _any_flagged(flagged):
            return mod
        settled = simplify_locally(mod, real, screens, flagged)
        return real()(fill_what_simplify_reads(mod)) if settled is None else settled

    return stand_in(real(), screened)


def SimplifyExpr() -> tvm.transform.Pass:
    """``relay.transform.SimplifyExpr()``, skipped where it would change nothing."""
    return _screened(relay.transform.SimplifyExpr, SIMPLIFY_EXPR_SCREENS)


def SimplifyExprPostAlterOp() -> tvm.transform.Pass:
    """``SimplifyExprPostAlterOp``, skipped where it would change nothing."""
    real = tvm.get_global_func("relay._transform.SimplifyExprPostAlterOp")
    return _screened(real, POST_ALTER_OP_SCREENS)
