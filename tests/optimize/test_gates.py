"""The gated passes: skipped only where the real pass changes nothing, and run on each thing they
rewrite."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tvm
from tvm import relay

from relay_tasks.optimize import gates

from pass_prefix import modules_before_each_pass
from zoo import X86, load, model_target_rows

_GATED: dict[str, Callable[[], tvm.transform.Pass]] = {
    "ToBasicBlockNormalForm": relay.transform.ToBasicBlockNormalForm,
    "Legalize": relay.transform.Legalize,
    "EliminateCommonSubexpr": relay.transform.EliminateCommonSubexpr,
    "SimplifyInference": relay.transform.SimplifyInference,
    "CanonicalizeCast": relay.transform.CanonicalizeCast,
    "CanonicalizeOps": relay.transform.CanonicalizeOps,
    "FlattenAtrousConv": relay.transform.FlattenAtrousConv,
    "BackwardFoldScaleAxis": relay.transform.BackwardFoldScaleAxis,
    "ForwardFoldScaleAxis": relay.transform.ForwardFoldScaleAxis,
    "EtaExpand": lambda: relay.transform.EtaExpand(
        expand_constructor=True, expand_global_var=False
    ),
    "qnn.Legalize": tvm.get_global_func("relay.qnn._transform.Legalize"),
}


#: Each gate's "could the pass rewrite this module?"; the rest ask the operator census.
_NEEDED: dict[str, Callable[[tvm.IRModule], bool]] = {
    "ToBasicBlockNormalForm": gates.has_scopes,
    "Legalize": gates.legalizes_something,
    "EliminateCommonSubexpr": gates.has_common_subexpressions,
    "CanonicalizeCast": gates.has_shared_upcasts,
    "EtaExpand": gates.has_constructors,
    "qnn.Legalize": gates.has_qnn_ops,
    "BackwardFoldScaleAxis": gates.may_fold_a_scale,
    "ForwardFoldScaleAxis": gates.may_fold_a_scale,
}


def _gate_skips(name: str, mod: tvm.IRModule) -> bool:
    needed = _NEEDED.get(name, lambda mod: gates.triggered(name, gates.ops_in(mod)))
    return not needed(mod)


def _typed(func: relay.Function) -> tvm.IRModule:
    return relay.transform.InferType()(tvm.IRModule.from_expr(func))


def _rewrites(name: str, mod: tvm.IRModule) -> bool:
    """Whether the real pass changes ``mod`` (under the target and PassContext entered)."""
    # A module of its own: EtaExpand and ToBasicBlockNormalForm update the one they are given.
    given = tvm.IRModule(mod.functions, mod.type_definitions)
    out = _GATED[name]()(given)
    # Structural equality does not see two equal projections merged into one: count nodes too.
    return not tvm.ir.structural_equal(out, mod) or _distinct_nodes(out) != _distinct_nodes(mod)


def _distinct_nodes(mod: tvm.IRModule) -> int:
    nodes: list[object] = []
    for func in mod.functions.values():
        relay.analysis.post_order_visit(func, nodes.append)
    return len(nodes)


@pytest.fixture
def x86() -> Iterator[None]:
    """The target and opt level the graph-by-graph tests run their passes under."""
    with tvm.target.Target(X86), tvm.transform.PassContext(opt_level=3):
        yield


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_gated_passes_skip_only_no_ops(model: str, target: str) -> None:
    """Wherever a pass is skipped for want of what it rewrites, the real pass returns the module
    unchanged."""
    mod, params = load(model)
    skipped = set()
    for name, typed in modules_before_each_pass(mod, params, target):
        if name == "FoldScaleAxis":
            # The group's two gated halves, each on what it would be given.
            backward = relay.transform.BackwardFoldScaleAxis()(typed)
            steps = (("BackwardFoldScaleAxis", typed), ("ForwardFoldScaleAxis", backward))
        else:
            steps = ((name, typed),)
        for step, given in steps:
            if step in _GATED and _gate_skips(step, given):
                assert not _rewrites(step, given), step
                skipped.add(step)
    assert {
        "EtaExpand",
        "FlattenAtrousConv",
        "qnn.Legalize",
        "ToBasicBlockNormalForm",
        "Legalize",
    } <= skipped


def _conv_nhwc(x: relay.Expr, dilation: int = 1) -> relay.Expr:
    weight = relay.const(np.ones((3, 3, 4, 4), "float32"))
    return relay.nn.conv2d(
        x, weight, kernel_size=(3, 3), dilation=dilation, data_layout="NHWC", kernel_layout="HWIO"
    )


def _scale(shape: tuple[int, ...]) -> relay.Constant:
    return relay.const(np.full(shape, 2.0, "float32"))


def _scale_graphs() -> dict[str, dict[str, relay.Function]]:
    """For each op FoldScaleAxis needs, a graph where each direction folds a scale through it."""
    x = relay.var("x", shape=(1, 4, 8, 8))
    x3 = relay.var("x", shape=(1, 4, 4, 4, 4))
    rows = relay.var("x", shape=(2, 4))
    w2 = relay.const(np.ones((4, 4, 3, 3), "float32"))
    w3 = relay.const(np.ones((4, 4, 3, 3, 3), "float32"))
    wd = relay.const(np.ones((4, 4), "float32"))

    def conv2d(data: relay.Expr) -> relay.Expr:
        return relay.nn.conv2d(data, w2, kernel_size=(3, 3), channels=4)

    def conv3d(data: relay.Expr) -> relay.Expr:
        return relay.nn.conv3d(data, w3, kernel_size=(3, 3, 3), channels=4)

    def dense(data: relay.Expr) -> relay.Expr:
        return relay.nn.dense(data, wd, units=4)

    backward = {
        "nn.conv2d": relay.Function([x], relay.multiply(conv2d(x), _scale((4, 1, 1)))),
        "nn.conv3d": relay.Function([x3], relay.multiply(conv3d(x3), _scale((4, 1, 1, 1)))),
        "nn.dense": relay.Function([rows], relay.multiply(dense(rows), _scale((4,)))),
    }
    forward = {
        "nn.conv2d": relay.Function([x], conv2d(relay.multiply(x, _scale((4, 1, 1))))),
        "nn.conv3d": relay.Function([x3], conv3d(relay.multiply(x3, _scale((4, 1, 1, 1))))),
        "nn.dense": relay.Function([rows], dense(relay.multiply(rows, _scale((4,))))),
    }
    for graphs in (backward, forward):
        graphs["multiply"] = graphs["nn.conv2d"]
    return {"BackwardFoldScaleAxis": backward, "ForwardFoldScaleAxis": forward}


def _trigger_graphs() -> dict[tuple[str, str], relay.Function]:
    """For each op a gated pass looks for, a graph with it where the pass rewrites."""
    x = relay.var("x", shape=(1, 4, 8, 8))
    nhwc = relay.var("x", shape=(1, 8, 8, 4))
    ones = relay.const(np.ones(4, "float32"))
    eights = relay.const(np.ones(8, "float32"))
    s2b = relay.nn.space_to_batch_nd(nhwc, [2, 2], [[2, 2], [2, 2]])
    graphs = {
        ("SimplifyInference", "nn.batch_norm"): relay.Function(
            [x], relay.nn.batch_norm(x, ones, ones, ones, ones)[0]
        ),
        ("SimplifyInference", "nn.dropout"): relay.Function([x], relay.nn.dropout(x)),
        ("SimplifyInference", "nn.instance_norm"): relay.Function(
            [x], relay.nn.instance_norm(x, ones, ones)
        ),
        ("SimplifyInference", "nn.layer_norm"): relay.Function(
            [x], relay.nn.layer_norm(x, eights, eights)
        ),
        ("SimplifyInference", "nn.group_norm"): relay.Function(
            [x], relay.nn.group_norm(x, ones, ones, num_groups=2)
        ),
        ("SimplifyInference", "nn.l2_normalize"): relay.Function(
            [x], relay.nn.l2_normalize(x, 1e-5, axis=[1])
        ),
        ("CanonicalizeOps", "nn.bias_add"): relay.Function([x], relay.nn.bias_add(x, ones)),
        ("FlattenAtrousConv", "nn.space_to_batch_nd"): relay.Function(
            [nhwc], relay.nn.batch_to_space_nd(_conv_nhwc(s2b), [2, 2], [[0, 0], [0, 0]])
        ),
    }
    for name, by_op in _scale_graphs().items():
        graphs.update({(name, op): func for op, func in by_op.items()})
    return graphs


@pytest.mark.usefixtures("x86")
def test_op_gated_passes_run_on_every_op_they_look_for() -> None:
    """Each op a gate looks for is in a graph where its pass rewrites, and every op a gate looks
    for has such a graph."""
    graphs = _trigger_graphs()
    looked_for = {
        (name, op) for name, sets in gates.OP_TRIGGERS.items() for ops in sets for op in ops
    }
    assert set(graphs) == looked_for
    for (name, op), func in graphs.items():
        mod = _typed(func)
        assert not _gate_skips(name, mod), (name, op)
        assert _rewrites(name, mod), (name, op)


@pytest.mark.usefixtures("x86")
def test_fold_scale_axis_needs_a_scale_and_a_weight_to_fold_it_into() -> None:
    x = relay.var("x", shape=(1, 4, 8, 8))
    scaled = _typed(relay.Function([x], relay.nn.relu(relay.multiply(x, _scale((4, 1, 1))))))
    weights = relay.const(np.ones((4, 4, 3, 3), "float32"))
    unscaled = _typed(relay.Function([x], relay.nn.conv2d(x, weights, kernel_size=(3, 3))))
    for name in ("BackwardFoldScaleAxis", "ForwardFoldScaleAxis"):
        assert _gate_skips(name, scaled) and _gate_skips(name, unscaled)
        assert not _rewrites(name, scaled) and not _rewrites(name, unscaled)


@pytest.mark.usefixtures("x86")
def test_fold_scale_axis_needs_a_path_from_the_scale_to_a_weight() -> None:
    """A multiply and a dense both present but joined only through an op no scale passes."""
    rows = relay.var("x", shape=(2, 4))
    weight = relay.const(np.ones((4, 4), "float32"))
    apart = relay.nn.dense(relay.exp(relay.multiply(rows, _scale((4,)))), weight)
    after = relay.multiply(relay.exp(relay.nn.dense(rows, weight)), _scale((4,)))
    for body in (apart, after):
        mod = _typed(relay.Function([rows], body))
        for name in ("BackwardFoldScaleAxis", "ForwardFoldScaleAxis"):
            assert _gate_skips(name, mod) and not _rewrites(name, mod), name
    carried = relay.nn.relu(relay.add(relay.nn.dense(rows, weight), _scale((4,))))
    mod = _typed(relay.Function([rows], relay.multiply(carried, _scale((4,)))))
    assert not _gate_skips("BackwardFoldScaleAxis", mod)
    assert _rewrites("BackwardFoldScaleAxis", mod)


def test_the_scale_ops_are_those_tvm_registers_the_pass_for() -> None:
    def registered(attr: str) -> set[str]:
        names = (str(name) for name in tvm.ir.Op.list_op_names())
        return {name for name in names if tvm.ir.Op.get(name).get_attr(attr) is not None}

    messages = gates.SCALE_ABSORBERS | gates.SCALE_CARRIERS
    assert registered("FScaleAxisForwardPrep") | registered("FScaleAxisBackwardPrep") == messages
    rewrites = registered("FScaleAxisForwardRewrite") | registered("FScaleAxisBackwardTransform")
    assert rewrites == messages | {"multiply"}


def _scope_modules() -> dict[str, tvm.IRModule]:
    """For each construct that opens a scope (or a free variable), a module whose only function
    has it."""
    from tvm.relay.prelude import Prelude

    x = relay.var("x", shape=(2,))
    cond = relay.var("c", shape=(), dtype="bool")
    y = relay.exp(x)
    bound, inner, head = (relay.var(name, shape=(2,)) for name in ("b", "i", "h"))
    prelude = Prelude()
    _, cons, nil = prelude.mod.get_type("List")
    first = relay.PatternConstructor(cons, [relay.PatternVar(head), relay.PatternWildcard()])
    bodies = {
        "if": relay.If(cond, relay.add(y, y), relay.multiply(y, y)),
        "let": relay.Let(bound, y, relay.add(bound, bound)),
        "function": relay.Call(relay.Function([inner], relay.exp(inner)), [x]),
        "match": relay.Match(cons(x, nil()), [relay.Clause(first, head)]),
        "ref": relay.RefRead(relay.RefCreate(x)),
        "free variable": relay.add(x, relay.var("free", shape=(2,))),
    }
    return {
        kind: tvm.IRModule(
            {
                "main": relay.Function(
                    relay.analysis.free_vars(body) if kind != "free variable" else [x], body
                )
            },
            type_definitions=prelude.mod.type_definitions,
        )
        for kind, body in bodies.items()
    }


@pytest.mark.usefixtures("x86")
def test_basic_block_form_runs_on_every_scope_and_rewrites_one_that_lifts() -> None:
    modules = _scope_modules()
    for kind, mod in modules.items():
        assert gates.has_scopes(mod), kind
    lifted = relay.transform.InferType()(modules["if"])  # exp(x), used in both branches: a let
    assert _rewrites("ToBasicBlockNormalForm", lifted)


@pytest.mark.usefixtures("x86")
def test_qnn_legalize_runs_on_qnn_ops() -> None:
    x = relay.var("x", shape=(2, 4))
    scale, zero = relay.const(0.5), relay.const(0)
    quantized = relay.qnn.op.quantize(x, scale, zero, out_dtype="int8")
    mod = _typed(relay.Function([x], relay.qnn.op.dequantize(quantized, scale, zero)))
    assert not _gate_skips("qnn.Legalize", mod)
    assert _rewrites("qnn.Legalize", mod)


@pytest.mark.usefixtures("x86")
def test_eta_expand_runs_where_a_constructor_is_a_value() -> None:
    from tvm.relay.prelude import Prelude

    mod = tvm.IRModule()
    prelude = Prelude(mod)
    _, cons, nil = prelude.mod.get_type("List")
    x = relay.var("x", shape=(), dtype="float32")
    f = relay.var("f")
    body = relay.Let(f, cons, relay.Call(f, [x, nil()]))
    mod["main"] = relay.Function([x], body)
    mod = relay.transform.InferType()(mod)
    assert not _gate_skips("EtaExpand", mod)
    assert _rewrites("EtaExpand", mod)


def _int8_conv(data: relay.Expr) -> relay.Expr:
    """A uint8 x int8 convolution, which x86's legalization pads to VNNI's channel multiples."""
    weight = relay.const(np.ones((4, 3, 3, 3), "int8"))
    return relay.nn.conv2d(data, weight, kernel_size=(3, 3), out_dtype="int32")


@pytest.mark.usefixtures("x86")
def test_legalize_runs_where_a_hook_replaces_a_call_after_others_kept_theirs() -> None:
    x = relay.var("x", shape=(1, 3, 10, 10))
    kept = relay.nn.conv2d(x, relay.const(np.ones((3, 3, 3, 3), "float32")), kernel_size=(3, 3))
    mod = _typed(relay.Function([x], _int8_conv(relay.cast(kept, "uint8"))))
    assert not _gate_skips("Legalize", mod)
    assert _rewrites("Legalize", mod)
    floats = _typed(relay.Function([x], kept))
    assert _gate_skips("Legalize", floats) and not _rewrites("Legalize", floats)


def _common_graphs() -> dict[str, tuple[bool, relay.Function]]:
    """Pairs of expressions the pass merges (True) or keeps apart (False)."""
    x = relay.var("x", shape=(2, 3))
    y = relay.exp(x)
    one, also_one = relay.const(1.0), relay.const(1.0)
    zero, negative_zero = relay.const(0.0), relay.const(-0.0)
    rows, also_rows = relay.const(np.ones(3, "float32")), relay.const(np.ones(3, "float32"))
    split = relay.split(x, 3, axis=1)
    graphs = {
        "same call": (True, relay.Tuple([relay.exp(x), y])),
        "equal scalars": (True, relay.Tuple([relay.add(y, one), relay.add(y, also_one)])),
        "tuples of the same fields": (
            True,
            relay.Tuple([relay.concatenate([x, y], axis=0), relay.concatenate([x, y], axis=0)]),
        ),
        "same projection": (
            True,
            relay.Tuple(
                [relay.TupleGetItem(split.astuple(), 1), relay.TupleGetItem(split.astuple(), 1)]
            ),
        ),
        "other attributes": (False, relay.Tuple([relay.sum(x, axis=0), relay.sum(x, axis=1)])),
        "zero and negative zero": (
            False,
            relay.Tuple([relay.add(y, zero), relay.add(y, negative_zero)]),
        ),
        "equal tensors": (False, relay.Tuple([relay.add(y, rows), relay.add(y, also_rows)])),
        "other projections": (False, relay.Tuple([split[0], split[1]])),
    }
    return {kind: (merged, relay.Function([x], body)) for kind, (merged, body) in graphs.items()}


def _cast_graphs() -> dict[str, tuple[bool, relay.Function]]:
    """Casts the pass gives each user a copy of (True), or leaves shared (False)."""
    half = relay.var("h", shape=(4, 4), dtype="float16")
    full = relay.var("f", shape=(4, 4), dtype="float32")
    up, down = relay.cast(half, "float32"), relay.cast(full, "float16")
    weight = relay.const(np.ones((4, 4), "float32"))
    graphs = {
        "upcast, two elementwise users": (True, relay.Tuple([relay.exp(up), relay.log(up)])),
        "upcast, one broadcast user twice": (True, relay.add(up, up)),
        "downcast, two users": (False, relay.Tuple([relay.exp(down), relay.log(down)])),
        "upcast, one user": (False, relay.exp(up)),
        "upcast, two dense users": (
            False,
            relay.Tuple([relay.nn.dense(up, weight), relay.nn.dense(up, weight + weight)]),
        ),
    }
    return {
        kind: (copied, relay.Function(relay.analysis.free_vars(body), body))
        for kind, (copied, body) in graphs.items()
    }


@pytest.mark.usefixtures("x86")
@pytest.mark.parametrize(
    ("name", "graphs"),
    [("EliminateCommonSubexpr", _common_graphs), ("CanonicalizeCast", _cast_graphs)],
)
def test_the_gate_says_run_exactly_where_the_pass_rewrites(
    name: str, graphs: Callable[[], dict[str, tuple[bool, relay.Function]]]
) -> None:
    """Common subexpressions are what the pass merges; shared upcasts what it copies."""
    for kind, (rewritten, func) in graphs().items():
        mod = _typed(func)
        assert _NEEDED[name](mod) == rewritten, kind
        assert _rewrites(name, mod) == rewritten, kind
