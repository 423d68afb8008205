"""The module walk: our FoldConstant equals TVM's on every model, and the pipeline never compiles."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.ir.instrument import pass_instrument

from relay_tasks.adapters.meta_schedule import DEFAULT_PASS_CONFIG
from relay_tasks.inputs import as_module
from relay_tasks.optimize import fold
from relay_tasks.optimize.fold import prefold_function
from relay_tasks.optimize.pipeline import PassSettings, extraction_scope, optimize

from checks import assert_typed_alike, constant, counting_llvm_builds, fold_both
from zoo import CUDA, X86, load, model_target_rows


@pass_instrument
class _CurrentPass:
    def __init__(self) -> None:
        self.stack: list[str] = []

    def run_before_pass(self, mod, info) -> None:
        self.stack.append(str(info.name))

    def run_after_pass(self, mod, info) -> None:
        self.stack.pop()


def _builds_by_pass(model: str, target: str) -> list[str]:
    mod, params = load(model)
    current = _CurrentPass()
    settings = PassSettings(config=dict(DEFAULT_PASS_CONFIG))
    context = tvm.transform.PassContext(3, config=dict(DEFAULT_PASS_CONFIG), instruments=[current])
    with (
        counting_llvm_builds(lambda: current.stack[0] if current.stack else "") as builds,
        extraction_scope(tvm.target.Target(target), settings),
        context,
    ):
        optimize(as_module(mod), params)
    return builds


@pytest.mark.parametrize(
    ("model", "target"), [r for r in model_target_rows() if r.values[0] != "simplify_patterns"]
)
def test_the_pipeline_never_compiles(model: str, target: str) -> None:
    assert _builds_by_pass(model, target) == []


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_tvm_fold_is_skipped_only_where_it_would_just_infer_types(
    model: str, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the numpy folder leaves nothing TVM's FoldConstant rewrites, the pass is skipped
    and the module only typed; on every module where that happens, TVM's pass gives the same,
    and every node has the type that inference over the whole module gives it (also where only
    the new constants were typed)."""
    skipped: list[tuple[tvm.IRModule, tvm.IRModule]] = []

    def spy(mod: tvm.IRModule, made: Any) -> tvm.IRModule:
        result = real(mod, made)
        skipped.append((mod, result))
        return result

    real = fold.only_typed
    monkeypatch.setattr(fold, "only_typed", spy)
    _builds_by_pass(model, target)
    assert skipped
    for mod, result in skipped:
        typed = relay.transform.InferType()(mod)
        assert tvm.ir.structural_equal(relay.transform.FoldConstant()(mod), typed)
        assert_typed_alike(result, typed)


@pass_instrument
class _InferTypeRuns:
    """Counts type inference over the model's module (``main`` has parameters), not over the
    one-constant modules that type a single constant."""

    def __init__(self) -> None:
        self.runs = 0

    def run_before_pass(self, mod, info) -> None:
        self.runs += str(info.name) == "InferType" and len(mod["main"].params) > 0


def _fold_counting_inference(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    counter = _InferTypeRuns()
    with tvm.transform.PassContext(3, instruments=[counter]):
        folded = fold.FoldConstant()(mod)
    return folded, counter.runs


@pytest.mark.parametrize("dims", ["int32", "int64"])
def test_new_constants_are_typed_in_place_where_they_keep_the_replaced_types(dims: str) -> None:
    """A fold whose constants have exactly the types of the calls they replace types them alone
    (inference over the whole module would give every other node the type it has); one whose
    call was typed with 64-bit dimensions (a constant's are 32-bit) types the module again.
    Either way each node has the type that inference over the whole module gives it."""
    rng = np.random.default_rng(9)
    x = relay.var("x", shape=(4, 3))
    w = constant(rng.standard_normal((3, 4)).astype("float32"))
    scale = constant(rng.standard_normal((4,)).astype("float32"))
    shape = [tvm.tir.IntImm(dims, 4), tvm.tir.IntImm(dims, 3)]
    weight = relay.broadcast_to(relay.transpose(w), shape) * relay.expand_dims(scale, 1)
    func = relay.Function([x], relay.nn.relu(relay.add(x, weight)))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    folded, runs = _fold_counting_inference(mod)
    assert isinstance(folded["main"].body.args[0].args[1], relay.Constant)
    assert runs == (dims == "int64")
    assert_typed_alike(folded, relay.transform.InferType()(relay.transform.FoldConstant()(mod)))


def test_an_untyped_module_is_typed_after_the_fold() -> None:
    x = relay.var("x", shape=(2,))
    c = constant(np.array([1.5, -2.0], "float32"))
    mod = tvm.IRModule.from_expr(relay.Function([x], x + relay.negative(c)))
    folded, runs = _fold_counting_inference(mod)
    assert runs == 1
    assert_typed_alike(folded, relay.transform.InferType()(relay.transform.FoldConstant()(mod)))


def _let_constant() -> relay.Function:
    x = relay.var("x", shape=(2,))
    v = relay.var("v", shape=(2,))
    return relay.Function([x], relay.Let(v, constant(np.ones(2, "float32")), x + v))


def _if_constant() -> relay.Function:
    x = relay.var("x", shape=(2,))
    return relay.Function([x], relay.If(constant(np.array(True)), x, relay.negative(x)))


def _projection_of_tuple() -> relay.Function:
    x = relay.var("x", shape=(2,))
    return relay.Function([x], relay.TupleGetItem(relay.Tuple([x, relay.negative(x)]), 1))


def _shape_query(op: str) -> relay.Function:
    x = relay.var("x", shape=(2, 3))
    query = relay.shape_of(x) if op == "shape_of" else relay.ndarray_size(x)
    return relay.Function([x], query)


def _constant_call(op: str) -> relay.Function:
    x = relay.var("x", shape=(2,))
    c = constant(np.array([1.5, -2.0], "float32"))
    if op == "exp":  # no evaluator here
        return relay.Function([x], x + relay.exp(c))
    return relay.Function([x], x + relay.sum(relay.stack([c, c], 0), axis=0))


@pytest.mark.parametrize(
    "build",
    [
        _let_constant,
        _if_constant,
        _projection_of_tuple,
        lambda: _shape_query("shape_of"),
        lambda: _shape_query("ndarray_size"),
        lambda: _constant_call("exp"),
        lambda: _constant_call("concatenate"),
    ],
    ids=["let", "if", "tuple_get_item", "shape_of", "ndarray_size", "call", "tuple_arg"],
)
def test_what_tvm_fold_rewrites_keeps_it(build: Any) -> None:
    """Each kind of node TVM's FoldConstant rewrites makes the gate run it (and it does rewrite:
    its result is not what type inference alone gives)."""
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(build()))
    assert prefold_function(mod["main"])[1]
    folded = relay.transform.FoldConstant()(mod)["main"]
    assert not tvm.ir.structural_equal(folded, mod["main"])


def test_only_simplify_expr_folds_inside_itself() -> None:
    """SimplifyExpr's own rewrites (x + c1) * c2 and x * c1 * c2 fold c1 * c2 with TVM inside
    the C++ pass, out of our reach; on graphs that have them, those are the only builds."""
    builds = _builds_by_pass("simplify_patterns", X86)
    assert builds and set(builds) == {"SimplifyExpr"}


def test_uncovered_ops_fall_back_to_tvm_and_agree() -> None:
    x = np.linspace(-3, 3, 12, dtype="float32").reshape(3, 4)
    body = relay.exp(constant(x)) * constant(np.float32(2.0))
    func = relay.Function([], body)
    with counting_llvm_builds() as builds:
        ours = fold.FoldConstant()(tvm.IRModule.from_expr(func))
    theirs = relay.transform.FoldConstant()(tvm.IRModule.from_expr(func))
    assert builds, "exp is not covered, so TVM must have evaluated it"
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])


def test_prefold_leaves_shape_of_graphs_to_tvm() -> None:
    x = relay.var("x", shape=(2, 3))
    body = relay.add(relay.shape_of(x), constant(np.array([1, 1], "int32")))
    func = relay.Function(
        [x],
        relay.multiply(constant(np.float32(2)), constant(np.float32(3)))
        + relay.sum(relay.cast(body, "float32")),
    )
    assert prefold_function(func)[0].same_as(func)


@pytest.mark.parametrize("target", [X86, CUDA])
def test_folded_module_equals_upstream_fold_constant(target: str) -> None:
    """Whole pipeline up to FuseOps, ours vs upstream's pass prefix: the same module.

    With ``link_params`` FuseOps puts the weights inside the fused functions, so every folded
    value is compared here, and our folds compute them all (nothing is deferred).
    """
    mod, params = load("conv_bias_bn_relu")
    tgt = tvm.target.Target(target)
    config = {**DEFAULT_PASS_CONFIG, "relay.FuseOps.link_params": True}
    with extraction_scope(tgt, PassSettings(config=config)):
        ours = optimize(as_module(mod), params)
        bound = relay.build_module.bind_params_by_name(load("conv_bias_bn_relu")[0]["main"], params)
        prefix = tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, True)
        seq = tvm.transform.Sequential([prefix, relay.transform.FuseOps()])
        theirs = seq(tvm.IRModule.from_expr(bound))
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])


@pytest.mark.parametrize("primitive", [1, 0])
def test_primitive_functions_are_folded_only_as_fold_constant_folds_them(primitive: int) -> None:
    """FoldConstant leaves the inside of a primitive (fused) function alone."""
    x = relay.var("x", shape=(2,))
    one = constant(np.ones(2, "float32"))
    inner = relay.Function([x], relay.add(x, relay.add(one, one))).with_attr("Primitive", primitive)
    y = relay.var("y", shape=(2,))
    func = relay.Function([y], relay.Call(inner, [y]))
    ours, theirs = fold_both(func)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])
    assert prefold_function(func)[0].same_as(func) == bool(primitive)


def test_bool_constants_are_read_as_bools() -> None:
    """DLPack does not carry bool here: such constants are read through a copy."""
    condition = np.array([[True], [False], [True]])
    x, y = np.ones((3, 4), "float32"), np.zeros((1, 4), "float32")
    func = relay.Function([], relay.where(constant(condition), constant(x), constant(y)))
    ours, theirs = fold_both(func)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])
    assert isinstance(prefold_function(func)[0].body, relay.Constant)


def test_reshaped_and_broadcast_weights_fold_as_tvm_folds_them() -> None:
    """PyTorch's linear layers reach the fold as reshape(broadcast_to(transpose(W))): the
    reshaped and broadcast results share the transposed weight's buffer instead of copying it.
    The module must equal TVM's fold, and each constant keep its own value when another
    constant of the chain is read or dropped."""
    import gc

    w = np.random.default_rng(5).standard_normal((96, 80)).astype("float32")
    x = relay.var("x", shape=(1, 4, 80))
    weight = relay.reshape(
        relay.broadcast_to(relay.transpose(relay.const(w)), (1, 80, 96)), (1, 80, 96)
    )
    tiled = relay.reshape(
        relay.broadcast_to(relay.transpose(relay.const(w)), (2, 80, 96)), (2, 80, 96)
    )
    func = relay.Function(
        [x], relay.Tuple([relay.nn.batch_matmul(x, weight, transpose_b=False), tiled])
    )
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    ours = relay.transform.InferType()(tvm.IRModule.from_expr(prefold_function(mod["main"])[0]))
    theirs = relay.transform.FoldConstant()(mod)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])
    constants = [ours["main"].body.fields[0].args[1], ours["main"].body.fields[1]]
    del ours, mod, func
    gc.collect()
    assert np.array_equal(constants[0].data.numpy()[0], w.T)
    assert np.array_equal(constants[1].data.numpy()[1], w.T)


def test_reshapes_and_unit_broadcasts_of_a_folded_constant_share_its_buffer() -> None:
    """The operand's bytes under another shape become a view of its array, not a copy (72
    weight matrices of BERT-base from PyTorch: 650 MB of copies otherwise)."""
    from relay_tasks.optimize.placeholders import buffer_address

    w = np.random.default_rng(6).standard_normal((64, 96)).astype("float32")
    t = relay.transpose(relay.const(w))
    outputs = [t, relay.reshape(t, (96 * 64,)), relay.broadcast_to(t, (1, 96, 64))]
    func = relay.Function([], relay.Tuple(outputs))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    folded, _ = prefold_function(mod["main"])
    assert tvm.ir.structural_equal(folded, relay.transform.FoldConstant()(mod)["main"])
    assert len({buffer_address(field.data) for field in folded.body.fields}) == 1


def test_fresh_results_become_constants_without_a_copy_and_views_are_copied() -> None:
    from relay_tasks.optimize.evaluate import aligned_empty, as_ndarray

    fresh = aligned_empty((64, 64), "float32")
    fresh[...] = 1.5
    shared = as_ndarray(fresh)
    fresh[0, 0] = 7.0  # the constant is this very buffer
    assert shared.numpy()[0, 0] == 7.0
    view = np.broadcast_to(np.float32(2.0), (8, 8))  # read-only: copied
    copied = as_ndarray(view)
    assert np.array_equal(copied.numpy(), view)
    unaligned = np.zeros(65, "float32")[1:]
    assert np.array_equal(as_ndarray(unaligned).numpy(), unaligned)


@pytest.mark.parametrize(
    ("config", "executor", "linked"),
    [
        (None, None, False),
        (None, {}, False),
        (None, {"link-params": False}, False),
        (None, {"link-params": True}, True),
        (True, None, True),
        (False, {"link-params": True}, False),  # the pass config wins, as in FuseOps
        (True, {"link-params": False}, True),
    ],
)
def test_links_params_decides_as_fuse_ops_does(config: Any, executor: Any, linked: bool) -> None:
    from relay_tasks.optimize.fold import links_params

    mod = tvm.IRModule.from_expr(relay.Function([], relay.const(1.0)))
    if executor is not None:
        mod = mod.with_attr("executor", relay.backend.Executor("graph", executor))
    options = {} if config is None else {"relay.FuseOps.link_params": config}
    assert links_params(mod, tvm.transform.PassContext(config=options)) is linked


#: A few hundred bytes of model that fold into gigabytes (issue 50): numpy's path, TVM's own
#: fold (a let-bound value goes to TVM's pass), and ONNX's ConstantOfShape.
_HUGE_FULL = 'add(%x, sum(full(1f, shape=[34000, 34000], dtype="float32")))'
_HUGE = {
    "full": f"def @main(%x: Tensor[(1), float32]) {{ {_HUGE_FULL} }}",
    "let": "def @main(%x: Tensor[(1), float32]) { let %a = full(1f, shape=[34000, 34000], "
    'dtype="float32"); add(%x, sum(%a)) }',
}


def _constant_of_shape(path: Any, side: int) -> Any:
    import onnx
    from onnx import TensorProto, helper

    shape = helper.make_tensor("s", TensorProto.INT64, [2], [side, side])
    value = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], value=value),
         helper.make_node("ReduceSum", ["c"], ["r"], keepdims=0),
         helper.make_node("Add", ["x", "r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[shape],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.mark.parametrize("how", [*_HUGE, "onnx"])
def test_a_tiny_model_that_folds_into_gigabytes_is_refused_before_allocating(
    how: str, tmp_path, capsys
) -> None:
    """Before, ``extract`` of the 147-byte text exited 0 after peaking at 10.3 GB."""
    from relay_tasks.cli import main

    if how == "onnx":
        path = _constant_of_shape(tmp_path / "model.onnx", 36000)
    else:
        path = tmp_path / "model.txt"
        path.write_text('#[version = "0.0.5"]\n' + _HUGE[how])
    assert main(["extract", str(path)]) == 3
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert (
        "folding full makes a constant of" in err
        and "GiB), more than the 1.00 GiB one folded constant" in err
    )
    assert "RELAY_TASKS_MAX_CONSTANT_BYTES" in err


def test_the_constant_limits_are_settable(tmp_path, capsys, monkeypatch) -> None:
    from relay_tasks.cli import main

    path = _constant_of_shape(tmp_path / "model.onnx", 64)  # 16 KiB
    assert main(["extract", str(path)]) == 0
    monkeypatch.setenv("RELAY_TASKS_MAX_CONSTANT_BYTES", "16000")
    capsys.readouterr()
    assert main(["extract", str(path)]) == 3
    assert (
        "(16.00 KiB), more than the 15.62 KiB one folded constant may take"
        in capsys.readouterr().err
    )
    monkeypatch.setenv("RELAY_TASKS_MAX_CONSTANT_BYTES", "16384")
    monkeypatch.setenv("RELAY_TASKS_MAX_CONSTANTS_BYTES", "100")
    assert main(["extract", str(path)]) == 3
    assert "which takes the model's folded constants past 100 bytes" in capsys.readouterr().err
