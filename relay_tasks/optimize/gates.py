"""Passes of the prefix skipped on modules where they provably change nothing.

A Relay function pass ends by type-checking the whole module, whether or not it rewrote
anything: 20-50 ms each on ResNet-50 or a transformer, and most of a single operator's
extraction. Each gate here asks a cheap question that TVM answers in C++ (the operator census,
the feature detector) about what the pass could rewrite; where the answer is "nothing", the
module (already typed: every pass here requires type inference or keeps types) is returned as
it is, otherwise the real pass runs. Each gate is checked against its real pass on every model
of the test zoo, and each reason to run has a graph where the real pass rewrites.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import tvm
from tvm import relay

from ..ir import FunctionReads, is_optimizable, node_key, reads_of, stand_in
from .placeholders import fill


def _skipped_unless(
    real: tvm.transform.Pass,
    needed: Callable[[tvm.IRModule], bool],
    prepare: Callable[[tvm.IRModule], None] | None = None,
) -> tvm.transform.Pass:
    """``real`` under its own name, opt level and requirements, run (after ``prepare``) only on
    modules where ``needed`` says it could change something; elsewhere the module is returned
    as it is."""

    def run(mod: tvm.IRModule) -> tvm.IRModule:
        if not needed(mod):
            return mod
        if prepare is not None:
            prepare(mod)
        return real(mod)

    return stand_in(real, run)


def ops_in(mod: tvm.IRModule) -> set[str]:
    """The names of the ops called anywhere in ``mod`` (fused functions included)."""
    return {str(op) for op in relay.analysis.list_op_freqs(mod)}


#: FoldScaleAxis: the ops that absorb a scale into their weight, and the ops a scale travels
#: through between them and the ``multiply`` that makes it (the ops TVM registers the pass's
#: message functions for: a test compares both sets with the registry).
SCALE_ABSORBERS = frozenset({"nn.conv2d", "nn.conv3d", "nn.dense"})
SCALE_CARRIERS = frozenset({"nn.relu", "nn.leaky_relu", "add", "subtract", "nn.bias_add"})


#: Function passes that rewrite only where the module calls an op of each of their sets (their
#: C++ sources), and nothing elsewhere: a batch-norm, dropout or normalisation unpacked; an
#: upcast shared by elementwise ops duplicated; ``bias_add`` expanded; ``space_to_batch_nd`` ->
#: conv2d -> ``batch_to_space_nd`` flattened into a dilated conv2d; a ``multiply`` by a scale
#: folded into the weight of a convolution or dense it feeds or is fed by (the only op that
#: makes a scale, and the only ops that absorb one).
OP_TRIGGERS: dict[str, tuple[frozenset[str], ...]] = {
    "SimplifyInference": (
        frozenset(
            {
                "nn.batch_norm",
                "nn.dropout",
                "nn.instance_norm",
                "nn.layer_norm",
                "nn.group_norm",
                "nn.l2_normalize",
            }
        ),
    ),
    "CanonicalizeOps": (frozenset({"nn.bias_add"}),),
    "FlattenAtrousConv": (frozenset({"nn.space_to_batch_nd"}),),
    "BackwardFoldScaleAxis": (frozenset({"multiply"}), SCALE_ABSORBERS),
    "ForwardFoldScaleAxis": (frozenset({"multiply"}), SCALE_ABSORBERS),
}


def op_gated(real: tvm.transform.Pass) -> tvm.transform.Pass:
    """``real`` (a pass of :data:`OP_TRIGGERS`), skipped unless the module calls an op of each of
    its sets: it would return each function unchanged and the module typed, which it already is
    (the pass requires type inference first). The ops present come from TVM's own operator
    census, a C++ walk, so a model without them costs microseconds instead of a rewrite and a
    re-typing of the whole graph (20-50 ms each on ResNet-50 or GPT-2, and most of a single
    operator's extraction).
    """
    name = str(real.info.name)
    return _skipped_unless(real, lambda mod: triggered(name, ops_in(mod)))


def triggered(name: str, ops: set[str]) -> bool:
    """Whether ``ops`` (a module's) include one of each of the pass ``name``'s trigger sets."""
    return all(not group.isdisjoint(ops) for group in OP_TRIGGERS[name])


def FoldScaleAxis(real: tvm.transform.Pass) -> tvm.transform.Pass:
    """``real`` (Backward- or ForwardFoldScaleAxis), skipped where no scale can reach a weight
    (:func:`may_fold_a_scale`). Transformers have both multiplies and dense layers, but not
    joined: the two passes would re-type the module for nothing (40 ms on BERT-base). Where
    they run, the deferred fold results it reads are computed first (:func:`fill_scales`)."""
    return _skipped_unless(real, may_fold_a_scale, prepare=fill_scales)


#: Ops TVM looks through to the constant when it checks that a scale is positive.
_SCALE_VIEWS = frozenset({"expand_dims", "reshape", "transpose", "squeeze", "repeat"})


def fill_scales(mod: tvm.IRModule) -> None:
    """Compute the deferred constants FoldScaleAxis reads: the constant operands of
    ``multiply`` (through the views in :data:`_SCALE_VIEWS`), whose signs decide whether a scale
    may pass a ReLU. The pass reads no other value: the weights a scale folds into are read by
    the fold after it (a ConvNeXt's 126 weights, 1.4 s of copies, were computed here before)."""
    for reads, call in _calls(mod):
        if reads.op_name(call) != "multiply":
            continue
        for arg in reads.args(call):
            while isinstance(arg, relay.Call) and reads.op_name(arg) in _SCALE_VIEWS:
                arg = reads.args(arg)[0]
            if isinstance(arg, relay.Constant):
                fill(arg)


def may_fold_a_scale(mod: tvm.IRModule) -> bool:
    """Whether a ``multiply`` and a convolution or dense are joined by ops a scale travels
    through: the multiply fed by the layer's output (the backward pass folds it into the weight)
    or feeding the layer's data (the forward pass). Either pass folds nothing elsewhere: a
    scale is only made by a multiply and only absorbed by those layers."""
    if not triggered("BackwardFoldScaleAxis", ops_in(mod)):
        return False  # TVM's census says one of the two kinds is missing: no walk needed
    for reads, call in _calls(mod):
        name = reads.op_name(call)
        args = reads.args(call) if name else []
        if name == "multiply" and any(_reaches(reads, arg, SCALE_ABSORBERS) for arg in args):
            return True
        if name in SCALE_ABSORBERS and _reaches(reads, args[0], frozenset({"multiply"})):
            return True
    return False


def _reaches(reads: FunctionReads, expr: relay.Expr, targets: frozenset[str]) -> bool:
    """Whether ``expr`` is, or is computed through scale carriers from, a call to ``targets``."""
    pending, seen = [expr], set()
    while pending:
        node = pending.pop()
        name = reads.op_name(node)
        if not name or node_key(node) in seen:
            continue
        seen.add(node_key(node))
        if name in targets:
            return True
        if name in SCALE_CARRIERS:
            pending.extend(reads.args(node))
    return False


def CanonicalizeCast() -> tvm.transform.Pass:
    """``relay.transform.CanonicalizeCast()``, skipped where no upcast is shared by two
    elementwise or broadcast calls (:func:`has_shared_upcasts`)."""
    return _skipped_unless(relay.transform.CanonicalizeCast(), has_shared_upcasts)


#: TVM's ``TOpPattern`` of broadcast ops: this and lower (elementwise) make a call a user that
#: ``CanonicalizeCast`` gives a cast of its own.
_BROADCAST = 1


def has_shared_upcasts(mod: tvm.IRModule) -> bool:
    """Whether a ``cast`` to a wider dtype is an argument of elementwise or broadcast calls
    twice or more (counting each argument position): the pass then gives each use its own
    copy of the cast, so that fusion keeps the narrow dtype between functions, and rewrites
    nothing else."""
    if "cast" not in ops_in(mod):
        return False
    patterns: dict[int, int] = {}
    uses: dict[int, tuple[relay.Call, int]] = {}
    for reads, call in _calls(mod):
        op = reads.op(call)
        if not isinstance(op, tvm.ir.Op):
            continue
        key = node_key(op)
        if key not in patterns:
            pattern = op.get_attr("TOpPattern")
            patterns[key] = _BROADCAST + 1 if pattern is None else int(pattern)
        if patterns[key] > _BROADCAST:
            continue
        for arg in reads.args(call):
            if reads.op_name(arg) == "cast":
                count = uses.get(node_key(arg), (arg, 0))[1] + 1
                uses[node_key(arg)] = (arg, count)
    return any(count > 1 and _widens(cast) for cast, count in uses.values())


def _widens(cast: relay.Call) -> bool:
    source = cast.args[0].checked_type
    return bool(tvm.DataType(str(source.dtype)).bits < tvm.DataType(str(cast.attrs.dtype)).bits)


def QnnLegalize() -> tvm.transform.Pass:
    """C++'s ``qnn.Legalize``, skipped on models without qnn ops: it lowers them (QnnLegalize,
    then QnnCanonicalize) and touches nothing else."""
    return _skipped_unless(tvm.get_global_func("relay.qnn._transform.Legalize")(), has_qnn_ops)


def has_qnn_ops(mod: tvm.IRModule) -> bool:
    return any(op.startswith("qnn.") for op in ops_in(mod))


def EtaExpand() -> tvm.transform.Pass:
    """The prefix's ``EtaExpand(expand_constructor=True, expand_global_var=False)``, skipped in
    modules without constructors: it wraps only constructors used as values, but rebuilds every
    call (untyped) and updates the module it is given in place, so that the next pass's type
    inference (a whole-graph re-typing: 40 ms on ResNet-50) would run only to restore what was
    there. Whether a function has a constructor comes from TVM's feature detector, a C++ walk.
    """
    real = relay.transform.EtaExpand(expand_constructor=True, expand_global_var=False)
    return _skipped_unless(real, has_constructors)


def has_constructors(mod: tvm.IRModule) -> bool:
    """Whether any Relay function of ``mod`` mentions an ADT constructor."""
    from tvm.relay.analysis.feature import Feature

    return any(
        Feature.fConstructor in relay.analysis.detect_feature(func)
        for func in mod.functions.values()
        if isinstance(func, relay.Function)
    )


def ToBasicBlockNormalForm() -> tvm.transform.Pass:
    """``relay.transform.ToBasicBlockNormalForm()``, skipped on modules that are dataflow graphs:
    without a construct that opens a scope (``let``, ``if``, ``match``, a function literal, a
    reference) every expression lives in the one scope of its function, nothing is lifted into
    a ``let``, and the pass only rebuilds every call (untyped), so that the next pass's type
    inference re-types the whole graph (40 ms on ResNet-50) to get back what was there."""
    return _skipped_unless(relay.transform.ToBasicBlockNormalForm(), has_scopes)


#: What a function body of a pure dataflow graph is made of (``fGraph``: a node used twice).
_DATAFLOW_FEATURES = frozenset(
    {"fVar", "fGlobalVar", "fConstant", "fTuple", "fTupleGetItem", "fOp", "fCall", "fGraph"}
)


def has_scopes(mod: tvm.IRModule) -> bool:
    """Whether a Relay function of ``mod`` is more than a dataflow graph of one scope (or has
    free variables, which the real pass refuses), as TVM's feature detector, a C++ walk, sees
    its body."""
    for func in mod.functions.values():
        if not isinstance(func, relay.Function):
            continue
        features = {f.name for f in relay.analysis.detect_feature(func.body)}
        if not features <= _DATAFLOW_FEATURES or relay.analysis.free_vars(func):
            return True
    return False


def Legalize() -> tvm.transform.Pass:
    """``relay.transform.Legalize()``, skipped where every op's legalization hook keeps its call:
    the pass calls each hook on its call and uses what a hook returns instead. Here the same
    hooks are asked the same question (the call's attributes, arguments and types) in the same
    order, up to the first that returns a replacement, when the real pass runs. No hook is asked
    twice on models where nothing is legalized, which are most float models on CPU and GPU."""
    return _skipped_unless(relay.transform.Legalize(), legalizes_something)


def legalizes_something(mod: tvm.IRModule) -> bool:
    """Whether a legalization hook replaces a call in ``mod`` (see :func:`Legalize`)."""
    hooks = {}
    for name in ops_in(mod):
        op = tvm.ir.Op.get(name)
        hook = op.get_attr("FTVMLegalize")
        if hook is not None:
            hooks[node_key(op)] = hook
    if not hooks:
        return False
    for reads, call in _calls(mod):
        op = reads.op(call)
        hook = hooks.get(node_key(op)) if isinstance(op, tvm.ir.Op) else None
        if hook is not None:
            args = call.args  # TVM's own array, as the real pass hands it over
            types = [arg.checked_type for arg in args] + [call.checked_type]
            if hook(call.attrs, args, types) is not None:
                return True
    return False


def EliminateCommonSubexpr() -> tvm.transform.Pass:
    """The prefix's ``EliminateCommonSubexpr`` (no skip callback), skipped where no two calls, and
    no two tuple projections, are equal in its sense (:func:`has_common_subexpressions`)."""
    return _skipped_unless(relay.transform.EliminateCommonSubexpr(), has_common_subexpressions)


def has_common_subexpressions(mod: tvm.IRModule) -> bool:
    """Whether the pass would merge two expressions of ``mod``: calls to the same stateless op
    with equal attributes and equivalent arguments (the same node, scalar constants of the same
    bytes, or tuples of such fields), or projections of the same index from the same tuple.

    Each expression is compared with those before it in post order, as the pass does; where no
    pair is equal nothing is replaced, so no later comparison of the pass sees a changed
    argument either.
    """
    stateful: dict[int, bool] = {}
    calls: dict[tuple[Any, ...], list[relay.Call]] = {}
    projections: set[tuple[int, int]] = set()
    for reads, node in _nodes(mod):
        if isinstance(node, relay.TupleGetItem):
            key = (node_key(node.tuple_value), int(node.index))
            if key in projections:
                return True
            projections.add(key)
            continue
        op = reads.op(node) if isinstance(node, relay.Call) else None
        if not isinstance(op, tvm.ir.Op):
            continue
        op_key = node_key(op)
        if op_key not in stateful:
            stateful[op_key] = bool(op.get_attr("TOpIsStateful"))
        args = reads.args(node)
        if not args or stateful[op_key]:
            continue
        same_args = calls.setdefault((op_key, *(_argument_key(arg) for arg in args)), [])
        if any(_same_attrs(node.attrs, other.attrs) for other in same_args):
            return True
        same_args.append(node)
    return False


def _argument_key(arg: relay.Expr) -> Any:
    if isinstance(arg, relay.Tuple):
        return ("tuple", *(_field_key(field) for field in arg.fields))
    return _field_key(arg)


def _field_key(expr: relay.Expr) -> Any:
    """The node itself, except that scalar constants of the same dtype and bytes are one (TVM
    compares constants byte for byte)."""
    if isinstance(expr, relay.Constant) and len(expr.data.shape) == 0:
        value = expr.data.numpy()
        return ("scalar", str(value.dtype), value.tobytes())
    return node_key(expr)


def _same_attrs(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(tvm.ir.structural_equal(a, b))


def _nodes(mod: tvm.IRModule) -> Iterator[tuple[FunctionReads, Any]]:
    """Every node of the functions a function pass rewrites, each function in post order, with
    the reads of its function."""
    for func in mod.functions.values():
        if isinstance(func, relay.Function) and is_optimizable(func):
            reads = reads_of(func)
            for node in reads.nodes:
                yield reads, node


def _calls(mod: tvm.IRModule) -> Iterator[tuple[FunctionReads, relay.Call]]:
    return ((reads, node) for reads, node in _nodes(mod) if isinstance(node, relay.Call))
