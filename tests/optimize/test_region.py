"""Rewriting around flagged calls only gives what TVM's pass gives on the whole graph.

Random graphs built from the shapes the rewrites look for (chains of reshapes, transposes and
casts, identities on either side, adjacent constants, squares, fills, shared values, several
outputs), and the frontend models where the local path is what runs; every settled result is
compared with the real pass on the whole module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relay

from relay_tasks.optimize import simplify
from relay_tasks.optimize.region import run_on_region

import frontend_models
from checks import assert_typed_alike, counting_llvm_builds
from pass_prefix import modules_before_each_pass
from zoo import X86

POST_ALTER_OP = tvm.get_global_func("relay._transform.SimplifyExprPostAlterOp")
PASSES = {
    "SimplifyExpr": (relay.transform.SimplifyExpr, simplify.SIMPLIFY_EXPR_SCREENS),
    "SimplifyExprPostAlterOp": (POST_ALTER_OP, simplify.POST_ALTER_OP_SCREENS),
}
SHAPES = [(2, 3, 4), (6, 4), (4, 6), (24,), (2, 12), (3, 8), (1, 24)]


def _typed(out: relay.Expr) -> tvm.IRModule:
    mod = tvm.IRModule.from_expr(relay.Function(relay.analysis.free_vars(out), out))
    return relay.transform.InferType()(mod)


def _shape(value: relay.Expr) -> tuple[int, ...]:
    return tuple(int(d) for d in relay.transform.InferTypeLocal(value).shape)


def _dtype(value: relay.Expr) -> str:
    return str(relay.transform.InferTypeLocal(value).dtype)


def _scalar(draw: Callable[..., Any], dtype: str) -> relay.Expr:
    return relay.const(draw(st.sampled_from([0.0, 1.0, 2.0, 0.5, -1.0])), dtype)


def _step(draw: Callable[..., Any], values: list[relay.Expr]) -> relay.Expr:
    """One new value from the live ones, shaped for some rewrite (or for none)."""
    x = draw(st.sampled_from(values))
    dtype, shape = _dtype(x), _shape(x)
    kind = draw(
        st.sampled_from(
            [
                "reshape",
                "transpose",
                "cast",
                "identity",
                "self_add",
                "square",
                "constants",
                "fill",
                "clip",
                "other",
                "pair",
            ]
        )
    )
    if kind == "reshape":
        return relay.reshape(x, draw(st.sampled_from(SHAPES)))
    if kind == "transpose":
        return relay.transpose(x, draw(st.permutations(range(len(shape)))))
    if kind == "cast":
        return relay.cast(x, draw(st.sampled_from(["float32", "float16"])))
    if kind == "identity":
        op = draw(st.sampled_from([relay.add, relay.subtract, relay.multiply, relay.divide]))
        c = _scalar(draw, dtype)
        return op(c, x) if draw(st.booleans()) else op(x, c)
    if kind == "self_add":
        return relay.add(x, x)
    if kind == "square":
        return relay.multiply(x, x) if draw(st.booleans()) else relay.multiply(x, x * x)
    if kind == "constants":
        op = draw(st.sampled_from([relay.add, relay.multiply]))
        inner = draw(st.sampled_from([relay.add, relay.multiply]))
        return op(inner(x, _scalar(draw, dtype)), _scalar(draw, dtype))
    if kind == "fill":
        fill = draw(st.sampled_from([relay.zeros_like, relay.ones_like]))
        return relay.add(x, fill(x)) if draw(st.booleans()) else relay.multiply(fill(x), x)
    if kind == "clip":
        bound = float(np.finfo(dtype).max)
        limits = draw(st.sampled_from([(-bound, bound), (-1.0, 1.0)]))
        return relay.clip(x, *limits)
    if kind == "pair":
        y = draw(st.sampled_from([v for v in values if _shape(v) == shape and _dtype(v) == dtype]))
        return relay.add(x, y)
    return relay.sqrt(relay.nn.relu(x)) if draw(st.booleans()) else relay.tanh(x)


@st.composite
def rewrite_graphs(draw: Callable[..., Any]) -> tvm.IRModule:
    values: list[relay.Expr] = [relay.var("x", shape=(2, 3, 4))]
    for _ in range(draw(st.integers(1, 12))):
        values.append(_step(draw, values))
    outputs = draw(st.lists(st.sampled_from(values[1:]), min_size=1, max_size=3))
    return _typed(outputs[0] if len(outputs) == 1 else relay.Tuple(outputs))


def _local_equals_whole(mod: tvm.IRModule, name: str) -> bool:
    """Whether the local path settled; asserts that what it settled is the real pass's result."""
    real, screens = PASSES[name]
    try:
        whole = real()(mod)
    except tvm.TVMError as error:
        # TVM's own rewrites can undo each other forever ("Observed 100 rewrite passes"): the
        # pass fails on the graph, upstream's extraction with it, and nothing is compared.
        assert "rewrite passes" in str(error)
        with contextlib.suppress(tvm.TVMError):
            simplify.simplify_locally(mod, real, screens)
        return False
    local = simplify.simplify_locally(mod, real, screens)
    if local is None:
        return False
    assert tvm.ir.structural_equal(local, whole), f"{name}\n{mod}\nlocal:\n{local}\nwhole:\n{whole}"
    assert_typed_alike(local, whole)  # where re-typing was skipped too
    # Structural equality sees a value computed twice as equal to one computed once and shared;
    # the number of distinct nodes does not (duplicated work would become duplicated kernels).
    assert _distinct_nodes(local) == _distinct_nodes(whole)
    return True


def _distinct_nodes(mod: tvm.IRModule) -> int:
    nodes: list[Any] = []
    relay.analysis.post_order_visit(mod["main"], nodes.append)
    return len(nodes)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(mod=rewrite_graphs(), name=st.sampled_from(sorted(PASSES)))
def test_random_graphs_settle_to_the_whole_graph_result(mod: tvm.IRModule, name: str) -> None:
    _local_equals_whole(mod, name)


@st.composite
def reshape_graphs(draw: Callable[..., Any]) -> tvm.IRModule:
    """Chains of reshapes and reverse reshapes, shared values and untouched ops between them:
    graphs where a reshape pair is all SimplifyExpr could rewrite."""
    values: list[relay.Expr] = [relay.var("x", shape=(2, 3, 4))]
    for _ in range(draw(st.integers(1, 10))):
        x = draw(st.sampled_from(values))
        kind = draw(st.sampled_from(["reshape", "reverse", "other"]))
        if kind == "reshape":
            values.append(relay.reshape(x, draw(st.sampled_from(SHAPES))))
        elif kind == "reverse":
            rank = len(_shape(x))
            values.append(relay.reverse_reshape(x, [0] * (rank - 1) + [-1]))
        else:
            values.append(relay.tanh(x))
    outputs = draw(st.lists(st.sampled_from(values[1:]), min_size=1, max_size=3))
    return _typed(outputs[0] if len(outputs) == 1 else relay.Tuple(outputs))


def _ours_alone_settle(graphs: Any, callback: type, post_alter_op: bool) -> None:
    """On every graph of ``graphs`` that the screens flag, ``callback`` is the only rewrite
    of ours to run, and where it settles the graph its module is the whole pass's; at least
    half of at least 30 flagged graphs settle (so the path is really taken: 25 of 40 reshape
    graphs, the rest pairs whose inner reshape is used elsewhere)."""
    flagged = settled = 0

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(mod=graphs)
    def run(mod: tvm.IRModule) -> None:
        nonlocal flagged, settled
        calls = simplify.flagged_calls(mod["main"], simplify.SIMPLIFY_EXPR_SCREENS)
        if calls:
            own = simplify._own_rewrites(calls, simplify.SIMPLIFY_EXPR_SCREENS)
            assert [type(c) for c in own or ()] == [callback]
            flagged += 1
            settled += _local_equals_whole(mod, "SimplifyExpr")
        if post_alter_op:
            _local_equals_whole(mod, "SimplifyExprPostAlterOp")

    run()
    assert flagged >= 30 and settled * 2 >= flagged, (settled, flagged)


def test_reshape_pairs_alone_merge_as_simplify_expr_merges_them() -> None:
    """Where only reshape pairs are flagged, SimplifyReshape alone does the work, round after
    round: the same module as the whole pass; and most such graphs settle that way (the rest,
    pairs whose inner reshape is used elsewhere, go to the real pass)."""
    _ours_alone_settle(reshape_graphs(), simplify._ReshapePair, post_alter_op=True)


@st.composite
def transpose_graphs(draw: Callable[..., Any]) -> tvm.IRModule:
    """Chains of transposes (any order, the identity and the reversal without axes among
    them), shared values and untouched ops between them: graphs where transposes are all
    SimplifyExpr could rewrite."""
    values: list[relay.Expr] = [relay.var("x", shape=(2, 3, 4))]
    for _ in range(draw(st.integers(1, 10))):
        x = draw(st.sampled_from(values))
        kind = draw(st.sampled_from(["transpose", "transpose", "reversed", "other"]))
        if kind == "transpose":
            values.append(relay.transpose(x, draw(st.permutations(range(3)))))
        elif kind == "reversed":
            values.append(relay.transpose(x))
        else:
            values.append(relay.tanh(x))
    outputs = draw(st.lists(st.sampled_from(values[1:]), min_size=1, max_size=3))
    return _typed(outputs[0] if len(outputs) == 1 else relay.Tuple(outputs))


def test_transposes_alone_merge_as_simplify_expr_merges_them() -> None:
    """Where only transposes are flagged (pairs, and those that keep every axis), ours alone
    does the work: the same module as the whole pass; and most such graphs settle that way."""
    _ours_alone_settle(transpose_graphs(), simplify._TransposePair, post_alter_op=False)


def test_a_transpose_next_to_a_layout_transform_goes_to_the_pass() -> None:
    """TVM's pass merges a transpose with a layout transform too (changing ranks, by layout
    names): that pair is not ours."""
    x = relay.var("x", shape=(1, 4, 3, 3))
    mod = _typed(relay.layout_transform(relay.transpose(x, (0, 2, 3, 1)), "NHWC", "NCHW"))
    calls = simplify.flagged_calls(mod["main"], simplify.SIMPLIFY_EXPR_SCREENS)
    assert calls and simplify._own_rewrites(calls, simplify.SIMPLIFY_EXPR_SCREENS) is None
    assert _local_equals_whole(mod, "SimplifyExpr")


def test_reshape_chains_settle_locally() -> None:
    """A chain merges a pair per round (a reshape made in a round is typed only after it)."""
    x = relay.var("x", shape=(2, 3, 4))
    chain = x
    for shape in [(6, 4), (4, 6), (24,), (2, 12), (3, 8), (1, 24)]:
        chain = relay.reshape(chain, shape)
    assert _local_equals_whole(_typed(relay.tanh(chain)), "SimplifyExpr")


def _screenings(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """Counts the screenings of whole functions by the local loop, and its type inferences."""
    screened: list[int] = []
    real = simplify._flagged_by_function
    monkeypatch.setattr(simplify, "_flagged_by_function", lambda *a: screened.append(1) or real(*a))
    inferred: list[int] = []
    infer = relay.transform.InferType
    monkeypatch.setattr(relay.transform, "InferType", lambda: inferred.append(1) or infer())
    return screened, inferred


def test_after_our_rewrites_only_what_is_near_them_is_screened_again(monkeypatch) -> None:
    """Two reshape pairs and an adjacent-constant chain apart from each other: after our
    rewrites, nothing near what they replaced is flagged, so the function is not screened
    again, and as each replacement keeps the type of what it replaced, it is not re-typed
    either (each node has the type the whole pass gives it); the result is the whole pass's."""
    x = relay.var("x", shape=(2, 3, 4))
    pair = relay.reshape(relay.reshape(relay.tanh(x), (6, 4)), (24,))
    other = relay.reshape(relay.reshape(relay.exp(x), (4, 6)), (2, 12))
    scaled = relay.negative(x) * relay.const(np.float32(2.0)) * relay.const(np.float32(3.0))
    mod = _typed(relay.Tuple([relay.tanh(pair), relay.sigmoid(other), relay.exp(scaled)]))
    screenings, inferences = _screenings(monkeypatch)
    assert _local_equals_whole(mod, "SimplifyExpr")
    assert len(screenings) == 1 and inferences == []


@pytest.mark.parametrize(
    "build",
    [
        # The product of the constants is 1: the multiply it leaves is an identity.
        lambda x: x * relay.const(np.float32(2.0)) * relay.const(np.float32(0.5)),
        # The merged reshape is the inner one of another pair.
        lambda x: relay.reshape(relay.reshape(relay.reshape(x, (6, 4)), (24,)), (4, 6)),
    ],
    ids=["identity-left", "chain"],
)
def test_a_rewrite_that_leaves_a_flag_near_it_is_screened_again(build, monkeypatch) -> None:
    mod = _typed(relay.tanh(build(relay.var("x", shape=(2, 3, 4)))))
    screenings, inferences = _screenings(monkeypatch)
    assert _local_equals_whole(mod, "SimplifyExpr")
    assert len(screenings) >= 2 and inferences


def test_reshape_pairs_with_run_time_dimensions_stay() -> None:
    """A pair whose result has a run-time dimension is left as it is, by TVM and here."""
    x = relay.var("x", shape=(relay.Any(), 4))
    pair = relay.reshape(relay.reshape(x, (-1, 2)), (-1,))
    mod = _typed(pair)
    assert simplify._rewritten(mod["main"], [simplify._ReshapePair()]) is None
    assert tvm.ir.structural_equal(relay.transform.SimplifyExpr()(mod), mod)


def test_other_flags_beside_a_reshape_pair_take_the_whole_pass() -> None:
    x = relay.var("x", shape=(2, 3, 4))
    pair = relay.reshape(relay.reshape(x, (6, 4)), (24,))
    mod = _typed(relay.Tuple([pair, relay.add(x, x)]))
    calls = simplify.flagged_calls(mod["main"], simplify.SIMPLIFY_EXPR_SCREENS)
    assert len(calls) == 2
    assert simplify._own_rewrites(calls, simplify.SIMPLIFY_EXPR_SCREENS) is None


#: Constant operands for the adjacent-constant rewrite: values that fold exactly, that are
#: identities afterwards (2 * 0.5), NaN (numpy declines: TVM folds), integer overflow.
_OPERANDS = {
    "float32": [2.0, 0.5, -1.5, 3.0e38, float("nan")],
    "float16": [2.0, 0.5, -1.5],
    "int32": [3, -2, 2**30],
    "int64": [3, -2, 2**62],
}
_OPERAND_SHAPES = [(), (4,), (3, 1), (1, 3, 4)]


@st.composite
def adjacent_constant_graphs(draw: Callable[..., Any]) -> tvm.IRModule:
    """Chains of adds and multiplies by constants of several shapes and dtypes, on either side,
    with shared values and other ops between them."""
    dtype = draw(st.sampled_from(sorted(_OPERANDS)))
    values: list[relay.Expr] = [relay.var("x", shape=(2, 3, 4), dtype=dtype)]

    def constant() -> relay.Expr:
        value = draw(st.sampled_from(_OPERANDS[dtype]))
        shape = draw(st.sampled_from(_OPERAND_SHAPES))
        return relay.const(np.full(shape, value, dtype), dtype)

    op = draw(st.sampled_from([relay.add, relay.multiply]))
    for _ in range(draw(st.integers(2, 8))):
        x = values[-1] if draw(st.integers(0, 3)) else draw(st.sampled_from(values))
        kind = draw(st.sampled_from(["same", "same", "switch", "other"]))
        if kind == "other":
            values.append(relay.negative(x))
            continue
        if kind == "switch":
            op = relay.multiply if op is relay.add else relay.add
        c = constant()
        values.append(op(c, x) if draw(st.booleans()) else op(x, c))
    outputs = draw(st.lists(st.sampled_from(values[1:]), min_size=1, max_size=2))
    return _typed(outputs[0] if len(outputs) == 1 else relay.Tuple(outputs))


def test_adjacent_constants_merge_as_simplify_expr_merges_them() -> None:
    """Where the adjacent-constant rewrite is all that is flagged, ours (the product computed in
    numpy, or by TVM where numpy declines) settles to the whole pass's module, bit for bit; and
    that path is really taken on most graphs."""
    taken = 0

    @settings(max_examples=200, deadline=None, database=None, derandomize=True)
    @given(mod=adjacent_constant_graphs())
    def run(mod: tvm.IRModule) -> None:
        nonlocal taken
        calls = simplify.flagged_calls(mod["main"], simplify.SIMPLIFY_EXPR_SCREENS)
        own = simplify._own_rewrites(calls, simplify.SIMPLIFY_EXPR_SCREENS) if calls else None
        if own and _local_equals_whole(mod, "SimplifyExpr"):
            taken += any(isinstance(c, simplify._AdjacentConstants) for c in own)

    run()
    assert taken >= 40, taken


def test_adjacent_float_constants_are_multiplied_without_compiling() -> None:
    x = relay.var("x", shape=(2, 3, 4))
    c1, c2 = relay.const(np.full((4,), 1.25, "float32")), relay.const(np.float32(3.0))
    mod = _typed(relay.exp(x * c1 * c2))
    calls = simplify.flagged_calls(mod["main"], simplify.SIMPLIFY_EXPR_SCREENS)
    own = simplify._own_rewrites(calls, simplify.SIMPLIFY_EXPR_SCREENS)
    with counting_llvm_builds() as builds:
        ours = simplify._rewritten(mod["main"], own or [])
    assert builds == []
    ours_typed = relay.transform.InferType()(tvm.IRModule.from_expr(ours))
    assert tvm.ir.structural_equal(ours_typed, relay.transform.SimplifyExpr()(mod))


def test_most_random_graphs_settle_locally() -> None:
    """The property above would hold vacuously if the local path always handed over: most
    graphs that the real pass changes must be settled locally (measured: 176 of 206)."""
    changed = settled = 0

    @settings(max_examples=80, deadline=None, database=None, derandomize=True)
    @given(mod=rewrite_graphs())
    def run(mod: tvm.IRModule) -> None:
        nonlocal changed, settled
        if not tvm.ir.structural_equal(relay.transform.SimplifyExpr()(mod), mod):
            changed += 1
            settled += _local_equals_whole(mod, "SimplifyExpr")

    run()
    assert changed >= 20 and settled >= changed * 2 // 3, (settled, changed)


def _cases() -> dict[str, relay.Expr]:
    x = relay.var("x", shape=(2, 3, 4))
    inner = relay.reshape(x, (6, 4))
    shared_sqrt = relay.sqrt(x)
    plus_one = relay.add(x, relay.const(1.0))
    return {
        # The inner reshape is used again: TVM refuses to fold the chain, and so must the cut.
        "shared_interior": relay.Tuple([relay.reshape(inner, (24,)), relay.exp(inner)]),
        "chain": relay.reshape(relay.reshape(relay.reshape(x, (6, 4)), (4, 6)), (24,)),
        "identity_then_chain": relay.reshape(
            relay.add(relay.reshape(x, (24,)), relay.const(0.0)), (6, 4)
        ),
        "shared_sqrt": relay.Tuple([x / shared_sqrt, shared_sqrt * relay.const(2.0)]),
        # TVM's own pass loops on this one: ((y + no-op transpose of y) * 0) + 0.
        "rewrites_loop": relay.add(
            relay.multiply(
                relay.add(plus_one, relay.transpose(plus_one, axes=[0, 1, 2])), relay.const(0.0)
            ),
            relay.const(0.0),
        ),
        # TVM's SimplifyAdd builds multiply(s, 2) on the s it matched, so the shared add below
        # it is duplicated in the whole graph (the cut saw a variable there): handed over.
        "add_self_over_shared": relay.Tuple([plus_one, relay.add(*[relay.sqrt(plus_one)] * 2)]),
        "deep": relay.tanh(
            relay.reshape(relay.reshape(relay.tanh(relay.tanh(relay.exp(x))), (24,)), (6, 4))
        ),
    }


#: Cases whose flagged call TVM leaves alone or rewrites in a way a cut cannot reproduce, so the
#: local path hands the graph over, and the one whose whole-graph pass fails.
HANDED_OVER = {"shared_interior", "rewrites_loop", "add_self_over_shared"}


@pytest.mark.parametrize("case", sorted(_cases()))
def test_hand_made_graphs(case: str) -> None:
    mod = _typed(_cases()[case])
    assert _local_equals_whole(mod, "SimplifyExpr") == (case not in HANDED_OVER)


def test_a_cut_that_changes_nothing_hands_over() -> None:
    x = relay.var("x", shape=(2, 3, 4))
    inner = relay.reshape(x, (6, 4))
    mod = _typed(relay.Tuple([relay.reshape(inner, (24,)), relay.exp(inner)]))
    flagged = simplify.flagged_calls(mod["main"], simplify.SIMPLIFY_EXPR_SCREENS)
    assert flagged  # the outer reshape of a reshape is flagged...
    # ...but TVM does not rewrite it (its inner reshape is used elsewhere): no local result.
    assert run_on_region(mod["main"], flagged, lambda m: relay.transform.SimplifyExpr()(m)) is None


def test_control_flow_hands_over() -> None:
    x = relay.var("x", shape=(4,))
    cond = relay.var("c", shape=(), dtype="bool")
    chain = relay.reshape(relay.reshape(x, (2, 2)), (4,))
    mod = _typed(relay.If(cond, chain, x))
    flagged = simplify.flagged_calls(mod["main"], simplify.SIMPLIFY_EXPR_SCREENS)
    assert flagged
    assert run_on_region(mod["main"], flagged, lambda m: relay.transform.SimplifyExpr()(m)) is None


FRONTEND_ROWS = ["bert-2-layers", "gpt2-2-layers", "vit-small", "torchvision-resnet18-onnx"]


@pytest.mark.parametrize("model", FRONTEND_ROWS)
def test_frontend_models_settle_locally_to_the_whole_graph_result(model: str) -> None:
    """Where the pipeline meets each screened pass, the local result is the real pass's."""
    mod, params = frontend_models.load(model)
    settled: list[str] = []
    for name, typed in modules_before_each_pass(mod, params, X86):
        if name in PASSES and simplify.might_rewrite(typed, PASSES[name][1]):
            assert _local_equals_whole(typed, name), f"{model}: {name} handed over"
            settled.append(name)
    if model in ("bert-2-layers", "gpt2-2-layers"):
        assert settled  # the transformers reach SimplifyExpr with a rewrite to do


def test_a_reshape_pair_over_a_constant_pair_leaves_every_node_typed() -> None:
    """Found by the random graphs: both own rewrites in one function, the reshape pair merged
    first; the merged reshape, rebuilt when the adds below it merge, kept no type."""
    x = relay.var("x", shape=(2, 3, 4))
    added = relay.add(relay.add(x, relay.const(1.0)), relay.const(1.0))
    mod = _typed(relay.reshape(relay.reshape(added, [2, 3, 4]), [2, 3, 4]))
    assert _local_equals_whole(mod, "SimplifyExpr")
