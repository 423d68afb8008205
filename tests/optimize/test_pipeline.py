"""The pass pipeline: upstream's pass prefix, pass for pass, and the screened simplifications."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.ir.instrument import pass_instrument

from relay_tasks import ExtractionError
from relay_tasks.adapters.meta_schedule import DEFAULT_PASS_CONFIG
from relay_tasks.inputs import as_module
from relay_tasks.optimize import simplify
from relay_tasks.optimize.pipeline import (
    Group,
    PassSettings,
    bind_params,
    extraction_scope,
    optimize,
    pass_prefix,
    run_passes,
)

from checks import assert_typed_alike
from pass_prefix import modules_before_each_pass
from zoo import X86, load, model_target_rows


@pass_instrument
class _PassLog:
    """Names of the passes run, with their nesting depth."""

    def __init__(self) -> None:
        self.depth = 0
        self.runs: list[tuple[int, str]] = []

    def run_before_pass(self, mod: Any, info: Any) -> None:
        self.runs.append((self.depth, str(info.name)))
        self.depth += 1

    def run_after_pass(self, mod: Any, info: Any) -> None:
        self.depth -= 1


def _leaf_passes(runs: list[tuple[int, str]]) -> list[str]:
    """Transform passes in order, without InferType, group wrappers, the upstream pass that each
    of our same-named stand-ins (FoldConstant, SimplifyExpr...) runs inside itself, and the two
    halves of qnn.Legalize (ours skips them on models without qnn ops)."""
    names: list[str] = []
    stack: list[str] = []
    for depth, name in runs:
        del stack[depth:]
        nested_in_stand_in = bool(stack) and (stack[-1] == name or "qnn.Legalize" in stack)
        stack.append(name)
        if nested_in_stand_in or name in ("InferType", "sequential", "FoldScaleAxis"):
            continue
        names.append(name)
    return names


@pytest.mark.parametrize(
    ("opt_level", "disabled", "required"),
    [
        (3, (), ()),
        (2, (), ()),
        (3, ("AlterOpLayout",), ()),
        (4, (), ()),
        (3, ("FoldScaleAxis", "FoldConstant"), ()),
        (1, (), ("FoldScaleAxis", "AlterOpLayout")),
    ],
)
def test_same_passes_as_upstreams_prefix(
    opt_level: int, disabled: tuple[str, ...], required: tuple[str, ...]
) -> None:
    mod, params = load("conv_bias_bn_relu")
    target = tvm.target.Target(X86)
    runs = []
    bound = bind_params(as_module(mod), params)
    for run in (tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, True), None):
        log = _PassLog()
        with (
            target,
            tvm.transform.PassContext(
                opt_level, required_pass=required, disabled_pass=disabled, instruments=[log]
            ),
        ):
            if run:
                run(bound)
            else:
                run_passes(pass_prefix(), bound)
        runs.append(_leaf_passes(log.runs))
    assert runs[1] == runs[0]
    assert all(name in runs[0] for name in ("AlterOpLayout",) if name in required)


def test_groups_are_enabled_as_a_whole() -> None:
    prefix = pass_prefix()
    (group,) = [step for step in prefix if isinstance(step, Group)]
    assert group.name == "FoldScaleAxis"
    assert [p.info.name for p in group.passes] == [
        "BackwardFoldScaleAxis",
        "ForwardFoldScaleAxis",
        "FoldConstant",
    ]


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_screened_simplifications_skip_only_no_ops(model: str, target: str) -> None:
    """Wherever a screen says "nothing to rewrite", the real pass indeed changes nothing."""
    real = {
        "SimplifyExpr": (relay.transform.SimplifyExpr, simplify.SIMPLIFY_EXPR_SCREENS),
        "SimplifyExprPostAlterOp": (
            tvm.get_global_func("relay._transform.SimplifyExprPostAlterOp"),
            simplify.POST_ALTER_OP_SCREENS,
        ),
    }
    mod, params = load(model)
    checked = 0
    for name, typed in modules_before_each_pass(mod, params, target):
        if name in real:
            make_pass, screens = real[name]
            if not simplify.might_rewrite(typed, screens):
                assert tvm.ir.structural_equal(make_pass()(typed)["main"], typed["main"])
                checked += 1
    assert checked or model == "simplify_patterns"


def test_screens_fire_on_every_rewrite_they_stand_for() -> None:
    mod, _ = load("simplify_patterns")
    typed = relay.transform.InferType()(mod)
    calls: list[relay.Call] = []
    relay.analysis.post_order_visit(
        typed["main"],
        lambda n: calls.append(n) if isinstance(n, relay.Call) else None,
    )
    fired = {
        screen.rewrite
        for screen in simplify.SIMPLIFY_EXPR_SCREENS
        for call in calls
        if screen(call)
    }
    assert {
        "EliminateIdentity",
        "SimplifyAdd",
        "SimplifySameCast",
        "SwitchAddMultiply",
        "SimplifyAdjacentMultiplyOrAdd",
        "SimplifyClip",
    } <= fired


@pytest.mark.parametrize(
    "dtype", ["float32", "float16", "float64", "int32", "int8", "uint8", "bool"]
)
def test_a_scalar_operand_is_read_as_numpy_reads_it(dtype: str) -> None:
    """The identity screen's reading of a one-element constant (through DLPack) gives what
    ``NDArray.numpy()`` gives, for every shape of ones; anything larger is no scalar."""
    for shape in [(), (1,), (1, 1, 1)]:
        for value in (0, 1, 3):
            const = relay.const(np.full(shape, value).astype(dtype))
            assert simplify._scalar_value(const) == float(const.data.numpy().reshape(()))
    assert simplify._scalar_value(relay.const(np.ones((2, 1), dtype))) is None
    assert simplify._scalar_value(relay.const(np.ones((0,), dtype))) is None
    assert simplify._scalar_value(relay.var("x", shape=(), dtype=dtype)) is None


def test_cpu_feature_answers_are_remembered_per_target_and_restored() -> None:
    from tvm.target import _ffi_api as target_api

    from relay_tasks.optimize.pipeline import memoized_cpu_features

    raw = target_api.target_has_feature
    targets = [
        tvm.target.Target(X86),
        tvm.target.Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"),
        tvm.target.Target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon"),
    ]
    features = ["avx512f", "avx512bw", "avx2", "sse4.2", "neon"]
    expected = {(f, str(t)): bool(raw(f, t)) for f in features for t in targets}
    assert expected[("avx512f", str(targets[0]))] and not expected[("avx512f", str(targets[1]))]
    with memoized_cpu_features():
        assert target_api.target_has_feature is not raw
        for _ in range(2):  # asked twice: the second answers come from memory
            for (feature, name), answer in expected.items():
                target = next(t for t in targets if str(t) == name)
                assert bool(target_api.target_has_feature(feature, target)) == answer
                with target:  # no target given: the current one's answer
                    assert bool(target_api.target_has_feature(feature)) == answer
    assert target_api.target_has_feature is raw


def test_layout_hooks_reuse_the_strategy_choice_only_inside_the_hooks(monkeypatch) -> None:
    """Inside the conv2d/dense layout hooks a repeated call is answered from memory (the
    hook reads only the implementation's name and workload); outside them every call builds
    its own tensors, because TVM's fold lowers them; and everything is put back afterwards."""
    from tvm import topi
    from tvm.relay.backend import te_compiler

    from relay_tasks.optimize.pipeline import memoized_layout_hooks

    built: list[str] = []
    real_select = te_compiler.select_implementation

    def counting(op, *args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(str(op.name))
        return real_select(op, *args, **kwargs)

    monkeypatch.setattr(te_compiler, "select_implementation", counting)
    hooks = {name: getattr(topi.nn, name) for name in ("conv2d_alter_layout", "dense_alter_layout")}
    x = relay.var("x", shape=(1, 16, 14, 14))
    body = x
    for i in range(3):  # three identical convolutions
        w = relay.const(np.full((16, 16, 3, 3), 0.1 * (i + 1), "float32"))
        body = relay.nn.conv2d(body, w, padding=(1, 1), channels=16, kernel_size=(3, 3))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], body)))
    with tvm.target.Target(X86), tvm.transform.PassContext(opt_level=3):
        plain = relay.transform.AlterOpLayout()(mod)
        asked_plain = len(built)
        built.clear()
        with memoized_layout_hooks():
            remembered = relay.transform.AlterOpLayout()(mod)
            assert te_compiler.select_implementation is counting  # only inside the hooks
        asked_remembered = len(built)
    assert tvm.ir.structural_equal(plain, remembered)
    assert asked_plain == 3 and asked_remembered == 1
    assert {name: getattr(topi.nn, name) for name in hooks} == hooks
    assert te_compiler.select_implementation is counting


@pytest.mark.parametrize("level", [-1, 5, 3.0, "3", None])
def test_opt_level_outside_0_to_4_is_refused(level: Any) -> None:
    from relay_tasks import ModelError
    from relay_tasks.optimize.pipeline import PassSettings

    with pytest.raises(ModelError) as caught:
        PassSettings(level)
    assert str(caught.value) == f"opt_level must be an integer from 0 to 4, got {level!r}"


def test_settings_merge_the_users_on_top_and_become_the_pass_context() -> None:
    from relay_tasks.optimize.pipeline import PassSettings

    base = PassSettings(2, {"a": 1, "b": 2}, frozenset({"X"}))
    assert base.merged() == base
    merged = base.merged({"b": 3, "c": 4}, ["Y"])
    assert merged == PassSettings(2, {"a": 1, "b": 3, "c": 4}, frozenset({"X", "Y"}))
    config = {"relay.backend.use_meta_schedule": True}
    context = PassSettings(4, config, frozenset({"FoldScaleAxis", "AlterOpLayout"})).context()
    assert context.opt_level == 4
    assert dict(context.config) == config
    assert list(context.disabled_pass) == ["AlterOpLayout", "FoldScaleAxis"]
    assert PassSettings(0).context().opt_level == 0 and PassSettings(4).opt_level == 4


def test_binding_params_makes_a_new_module_only_when_there_are_params() -> None:
    mod = as_module(load("dense_softmax")[0])
    params = {k: tvm.nd.array(v) for k, v in load("dense_softmax")[1].items()}
    assert bind_params(mod, {}) is mod
    bound = bind_params(mod, params)
    assert bound is not mod and len(mod["main"].params) > 0
    assert [p.name_hint for p in bound["main"].params] == ["data"]


def test_the_strategy_memo_key_tells_apart_everything_the_choice_depends_on() -> None:
    """Two calls share the remembered implementation only if op, attributes, input shapes and
    dtypes, output type, target, AutoTVM use and dispatch context are all equal."""
    from tvm import autotvm

    from relay_tasks.optimize.pipeline import _implementation_key

    def key(**change: Any) -> Any:
        base = {
            "op": relay.op.get("nn.dense"),
            "attrs": tvm.ir.make_node("relay.attrs.DenseAttrs", units=8, out_dtype=""),
            "inputs": [tvm.te.placeholder((4, 16)), tvm.te.placeholder((8, 16))],
            "out_type": relay.TensorType((4, 8)),
            "target": tvm.target.Target(X86),
            "use_autotvm": True,
        }
        return _implementation_key(**{**base, **change})

    assert key() == key() and key() is not None
    variants = [
        {"op": relay.op.get("nn.batch_matmul")},
        {"attrs": tvm.ir.make_node("relay.attrs.DenseAttrs", units=8, out_dtype="float16")},
        {"attrs": None},
        {"inputs": [tvm.te.placeholder((2, 16)), tvm.te.placeholder((8, 16))]},
        {"inputs": [tvm.te.placeholder((4, 16), "float16"), tvm.te.placeholder((8, 16))]},
        {"out_type": relay.TensorType((4, 8), "float16")},
        {"target": tvm.target.Target("cuda")},
        {"use_autotvm": False},
    ]
    keys = [key(**v) for v in variants]
    assert all(k != key() for k in keys) and len(set(keys)) == len(keys)
    with autotvm.apply_history_best([]):  # another dispatch context
        inside = key()
    assert inside != key()
    dynamic = [tvm.te.placeholder((tvm.tir.Var("n", "int64"), 16)), tvm.te.placeholder((8, 16))]
    assert key(inputs=dynamic) is None


def test_a_pass_that_fails_is_one_extraction_error_naming_target_and_cause() -> None:
    """x86's dense alter-layout hook asks the op strategy for its compute: a compute that
    raises fails inside TVM's passes, before any lowering."""
    from tvm.relay.op import op as _op
    from tvm.relay.testing.temp_op_attr import TempOpAttr

    from relay_tasks import extract_tasks

    def strategy(attrs, inputs, out_type, target):
        def compute(attrs, inputs, out_type):
            raise RuntimeError("this TE compute is broken")

        found = _op.OpStrategy()
        found.add_implementation(compute, lambda attrs, outs, target: None, name="broken")
        return found

    mod, params = load("dense_softmax")
    with (
        TempOpAttr("nn.dense", "FTVMStrategy", strategy),
        pytest.raises(ExtractionError) as caught,
    ):
        extract_tasks(mod, X86, params)
    assert str(caught.value) == (
        "TVM failed to optimise the model for llvm: this TE compute is broken "
        "(raised by TVM's own passes, which upstream's extraction runs too; another layout or "
        "target for this op may avoid it)"
    )


def test_a_module_is_still_typed_only_while_its_functions_are_the_typed_ones() -> None:
    """The runner skips an InferType a pass asks for only if no function changed since the
    module was last typed."""
    from relay_tasks.optimize.pipeline import _Runner

    mod = relay.transform.InferType()(as_module(load("dense_softmax")[0]))
    runner = _Runner(tvm.transform.PassContext())
    assert not runner._still_typed(mod)
    runner.typed_now(mod)
    assert runner._still_typed(mod)
    changed = relay.transform.FoldConstant()(mod)
    assert not changed["main"].same_as(mod["main"])
    assert not runner._still_typed(changed)
    x = relay.var("x", shape=(2,))
    grown = tvm.IRModule(mod.functions, mod.type_definitions)
    grown[relay.GlobalVar("other")] = relay.Function([x], x)
    assert not runner._still_typed(grown)
    fewer = tvm.IRModule({mod.get_global_var("main"): mod["main"]})
    runner.typed_now(grown)
    assert not runner._still_typed(fewer)


def test_a_module_changed_in_place_is_not_still_typed() -> None:
    """TVM's EtaExpand replaces the functions of the module it is given by untyped rebuilds;
    the runner must not take that module for the typed one it was."""
    from relay_tasks.optimize.pipeline import _Runner

    mod = relay.transform.InferType()(as_module(load("dense_softmax")[0]))
    runner = _Runner(tvm.transform.PassContext())
    runner.typed_now(mod)
    expanded = relay.transform.EtaExpand(expand_constructor=True, expand_global_var=False)(mod)
    with pytest.raises(ValueError):
        expanded["main"].body.checked_type  # noqa: B018 (untyped: the rebuild)
    assert not runner._still_typed(expanded)


def test_a_required_pass_that_cannot_be_made_is_named() -> None:
    from relay_tasks.optimize.pipeline import _named_pass

    assert _named_pass("InferType").info.name == "InferType"
    with pytest.raises(ExtractionError) as caught:
        _named_pass("NoSuchPass")
    assert str(caught.value) == "cannot create the pass 'NoSuchPass' that another pass requires"


def _parallel(op: str, branches: int) -> tvm.IRModule:
    """``branches`` ops of one kind reading the same input, as CombineParallel* looks for."""
    if op == "conv2d":
        x = relay.var("x", shape=(1, 4, 8, 8))
        outs = [
            relay.nn.conv2d(x, relay.var(f"w{i}", shape=(4, 4, 3, 3)), padding=(1, 1))
            for i in range(branches)
        ]
    elif op == "dense":
        x = relay.var("x", shape=(2, 8))
        outs = [relay.nn.dense(x, relay.var(f"w{i}", shape=(8, 8))) for i in range(branches)]
    else:
        x = relay.var("x", shape=(2, 4, 8))
        outs = [
            relay.nn.batch_matmul(x, relay.var(f"w{i}", shape=(2, 8, 8))) for i in range(branches)
        ]
    body = relay.Tuple(outs)
    return tvm.IRModule.from_expr(relay.Function(relay.analysis.free_vars(body), body))


def _global_passed_as_value() -> tvm.IRModule:
    """main hands a global function to the Prelude's ``map`` (a value, not a call)."""
    from tvm.relay.prelude import Prelude

    mod = tvm.IRModule()
    prelude = Prelude(mod)
    x = relay.var("x", shape=(4,))
    double = relay.GlobalVar("double")
    mod[double] = relay.Function([x], x + x, ret_type=relay.TensorType((4,)))
    _, cons, nil = mod.get_type("List")
    data = relay.var("data", shape=(4,))
    mod["main"] = relay.Function([data], prelude.map(double, cons(data, nil())))
    return mod


def _op_calls(func: relay.Function, names: tuple[str, ...]) -> int:
    found: list[relay.Call] = []
    relay.analysis.post_order_visit(
        func,
        lambda n: (
            found.append(n)
            if isinstance(n, relay.Call) and getattr(n.op, "name", "") in names
            else None
        ),
    )
    return len(found)


_COMBINED = ("nn.conv2d", "nn.dense", "nn.batch_matmul")


@pytest.mark.parametrize(
    "build",
    [
        *(
            pytest.param(lambda op=op, n=n: _parallel(op, n), id=f"{op}-{n}")
            for op in ("conv2d", "dense", "batch_matmul")
            for n in (3, 4)
        ),
        pytest.param(_global_passed_as_value, id="global-as-value"),
    ],
)
def test_the_prefix_leaves_what_upstreams_leaves(build: Any) -> None:
    """Pass arguments matter, not only pass names: three parallel branches are combined at
    opt_level 4 (four too), global functions passed as values are not eta-expanded."""
    mod = relay.transform.InferType()(build())
    context = tvm.transform.PassContext(4, disabled_pass=["AlterOpLayout"])
    with tvm.target.Target(X86), context:
        theirs = tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, True)(mod)
        ours = run_passes(pass_prefix(), mod)
    assert tvm.ir.structural_equal(ours, theirs)
    before = _op_calls(mod["main"], _COMBINED)
    assert before == 0 or _op_calls(ours["main"], _COMBINED) == 1  # the branches combined


def test_a_required_infer_type_runs_only_when_the_module_changed(monkeypatch) -> None:
    """Upstream's Sequential would infer types four times here; nothing changes the functions
    after the first, so the runner infers them once."""
    from relay_tasks.optimize import pipeline

    names: list[str] = []
    real = pipeline._named_pass
    monkeypatch.setattr(pipeline, "_named_pass", lambda name: names.append(name) or real(name))
    keep = tvm.transform.module_pass(
        lambda mod, ctx: mod, opt_level=0, name="Keep", required=["InferType"]
    )
    simplify_inference = relay.transform.SimplifyInference()
    mod = as_module(load("dense_softmax")[0])  # untyped
    with tvm.transform.PassContext(opt_level=3):
        run_passes([keep, keep, simplify_inference, simplify_inference], mod)
    assert names == ["InferType"]


@pytest.mark.parametrize("model", ["conv_bias_bn_relu", "dense_softmax"])
def test_a_dataflow_model_is_typed_once_with_its_params_bound(model: str, monkeypatch) -> None:
    """One type inference, of the bound model, before the prefix: none for the unbound one and
    none required by a pass (every pass after it keeps the module typed)."""
    from relay_tasks.optimize import pipeline

    checked: list[tvm.IRModule] = []
    real_check = pipeline.type_check
    monkeypatch.setattr(pipeline, "type_check", lambda mod: checked.append(mod) or real_check(mod))
    required: list[str] = []
    real_pass = pipeline._named_pass
    monkeypatch.setattr(pipeline, "_named_pass", lambda n: required.append(n) or real_pass(n))
    mod, params = load(model)
    given = as_module(mod)
    with extraction_scope(tvm.target.Target(X86), PassSettings(config=dict(DEFAULT_PASS_CONFIG))):
        optimize(given, params)
    assert len(checked) == 1 and len(checked[0]["main"].params) < len(given["main"].params)
    assert required == []


def test_fusion_leaves_the_module_untyped_unless_instruments_watch_or_types_are_required() -> None:
    """Our FuseOps fuses as TVM's does but declines the type inference over the whole module
    that TVM's ends with; under a context with an instrument of its own, or one that requires
    InferType, the module is typed as TVM types it."""
    from relay_tasks.optimize.pipeline import FuseOps

    mod, params = load("conv_bias_bn_relu")
    with extraction_scope(tvm.target.Target(X86), PassSettings()):
        prefixed = run_passes(pass_prefix(), bind_params(as_module(mod), params))
        theirs = relay.transform.FuseOps()(prefixed)
        ours = FuseOps()(prefixed)
        untyped = optimize(as_module(mod), params, typed=False)
    assert tvm.ir.structural_equal(ours, theirs)
    for module in (ours, untyped):  # (the untyped optimize holds deferred constants: no equality)
        with pytest.raises(ValueError):
            module["main"].body.checked_type  # noqa: B018
    for context in (
        tvm.transform.PassContext(3, instruments=[_PassLog()]),
        tvm.transform.PassContext(3, required_pass=["InferType"]),
    ):
        with tvm.target.Target(X86), context:
            watched = FuseOps()(prefixed)
        assert_typed_alike(watched, theirs)


def test_deferred_constants_inside_fused_functions_are_computed_before_lowering(
    monkeypatch,
) -> None:
    """FuseOps keeps scalars inside the functions it fuses (and every constant, were the rule
    "no deferral when FuseOps links params" ever broken): lowering reads them, so they are
    computed once the module is fused, and it equals upstream's, constant values included."""
    from relay_tasks.optimize import fold

    monkeypatch.setattr(fold, "links_params", lambda mod, ctx: False)  # the rule, broken
    mod, params = load("conv_bias_bn_relu")
    config = {**DEFAULT_PASS_CONFIG, "relay.FuseOps.link_params": True}
    with extraction_scope(tvm.target.Target(X86), PassSettings(config=config)):
        ours = optimize(as_module(mod), params)
    bound = relay.build_module.bind_params_by_name(mod["main"], params)
    prefix = tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, True)
    with tvm.target.Target(X86), tvm.transform.PassContext(3, config=config):
        passes = tvm.transform.Sequential([prefix, relay.transform.FuseOps()])
        theirs = passes(tvm.IRModule.from_expr(bound))
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])


def test_a_pass_not_known_to_leave_constants_unread_gets_them_computed() -> None:
    """Deferred fold results are computed before any step outside the runner's list."""
    from relay_tasks.optimize.fold import FoldConstant
    from relay_tasks.optimize.placeholders import deferred_placeholders

    values = np.linspace(-1, 1, 4096, dtype="float32").reshape(64, 64)
    x = relay.var("x", shape=(64, 64))
    mod = tvm.IRModule.from_expr(relay.Function([x], x + relay.transpose(relay.const(values))))
    seen: list[np.ndarray] = []

    def read(mod: tvm.IRModule, ctx: Any) -> tvm.IRModule:
        relay.analysis.post_order_visit(
            mod["main"],
            lambda n: seen.append(n.data.numpy()) if isinstance(n, relay.Constant) else None,
        )
        return mod

    reader = tvm.transform.module_pass(read, opt_level=0, name="Reader")
    with tvm.transform.PassContext(opt_level=3), deferred_placeholders() as unfilled:
        folded = run_passes([FoldConstant()], relay.transform.InferType()(mod))
        assert len(unfilled) == 1  # deferred, so far
        run_passes([reader], folded)
    assert len(seen) == 1 and np.array_equal(seen[0], values.T)
