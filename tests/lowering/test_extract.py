"""The shared backend: compile-cache dedup, weights, order, and no schedule ever applied."""

from __future__ import annotations

import sys

import pytest
import tvm
from tvm import meta_schedule as ms
from tvm import relay, te, topi
from tvm.ir.supply import NameSupply
from tvm.relay.op import op as _op
from tvm.relay.op.strategy.generic import wrap_compute_dense
from tvm.relay.testing.temp_op_attr import TempOpAttr

from relay_tasks import Task, extract_tasks
from relay_tasks.adapters.meta_schedule import (
    DEFAULT_PASS_CONFIG,
    extract_task_from_relay,
    tir_module,
)
from relay_tasks.lowering.extract import run_extraction
from relay_tasks.lowering.vm_compiler import compiler_calls
from relay_tasks.optimize.pipeline import PassSettings
from relay_tasks.request import Request

import oracles
from checks import (
    assert_ansor_matches,
    assert_meta_schedule_matches,
    assert_same_extracted_tasks,
    assert_typed_alike,
)
from cuda_schedules import cuda_injective_schedules
from relay_graphs import linked_repeats
from small_graphs import partitioned_for_ccompiler
from zoo import CUDA, X86, load, model_target_rows


def _vm_names(tasks: list[Task]) -> list[str]:
    """The names the VM compiler gives its lowered functions (prefix, made unique in call order)."""
    names = NameSupply("vm_mod")
    names.reserve_name("main", False)
    return [names.fresh_name(t.name) for t in tasks]


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_distinct_functions_are_what_the_vm_compiler_lowers(model: str, target: str) -> None:
    """The legacy oracle: a real VMCompiler.lower with MetaSchedule on converts exactly our
    distinct functions to TIR, once each, in our call order, with equal TIR."""
    with cuda_injective_schedules():  # the VM compiler schedules; see cuda_schedules.py
        lowered = oracles.legacy_vm_lowering(model, target)
    mod, params = load(model)
    tasks = extract_tasks(mod, target, params, pass_config=DEFAULT_PASS_CONFIG)
    in_call_order = sorted(tasks, key=lambda t: t.calls[0])
    with tvm.target.Target(target), tvm.transform.PassContext(3, config=dict(DEFAULT_PASS_CONFIG)):
        tir = [tir_module(task, "default") for task in in_call_order]
    # The compiler names every function it lowers but converts to TIR (and so queries) only
    # those the TIR converter accepts; concatenate, for one, it declines.
    converted = [
        (name, mod) for name, mod in zip(_vm_names(in_call_order), tir, strict=True) if mod
    ]
    assert [q.name for q in lowered] == [name for name, _ in converted]
    for query, (name, ours) in zip(lowered, converted, strict=True):
        assert tvm.ir.structural_equal(query.mod, ours), name


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_backend_order_is_upstream_metaschedules(model: str, target: str) -> None:
    """The backend's own order, checked without any adapter (each adapter re-sorts): upstream's
    MetaSchedule tasks, found among ours by their Relay function, come in our order with our
    weights (most of ours are among them: upstream leaves out only what has no TIR)."""
    mod, params = load(model)
    ours = extract_tasks(mod, target, params, pass_config=DEFAULT_PASS_CONFIG)
    positions, weights = [], []
    for task in oracles.meta_schedule(model, target):
        func = task.mod[task.mod.get_global_vars()[0]]
        found = [i for i, t in enumerate(ours) if tvm.ir.structural_equal(t.func, func)]
        assert len(found) == 1, f"{task.task_name}: {len(found)} of our tasks have its function"
        positions.append(found[0])
        weights.append((ours[found[0]].weight, int(task.weight)))
    assert positions == sorted(positions), positions
    assert positions and len(positions) >= len(ours) * 2 // 3
    assert all(o == u for o, u in weights), weights


@pytest.mark.parametrize("target", [X86, CUDA])
def test_linked_constants_are_named_in_each_tuners_lowering_order(target: str) -> None:
    """Tensor constants are named from one supply in lowering order, and the names enter
    Ansor's workload keys. MetaSchedule's extraction lowers a repeated block at each
    occurrence (drawing a name each time), the VM compiler behind AutoTVM and Ansor once per
    distinct block (a cache hit draws none): with one rule for both, Ansor's two conv tasks
    swapped workload keys. Found by the mutation run."""
    mod = linked_repeats()
    assert_meta_schedule_matches(mod, {}, target)
    with cuda_injective_schedules():
        assert_ansor_matches(mod, {}, target, include_simple_tasks=True)
    # main's post order meets the outermost call first: the repeated block (twice: the name
    # "fused_constant_1" is drawn and thrown away), then the other; the compiler calls the
    # innermost first and lowers the repeated block once.
    expected = {
        None: {2: ["fused_constant"], 1: ["fused_constant_2"]},
        compiler_calls: {1: ["fused_constant"], 2: ["fused_constant_1"]},
    }
    request = Request.of(mod, target, {}, PassSettings(config=dict(DEFAULT_PASS_CONFIG)))
    for call_order, names in expected.items():
        tasks = run_extraction(request, call_order=call_order)
        found = {
            t.weight: [c.op.name for c, _ in t.lowered.constants]
            for t in tasks
            if t.lowered.constants
        }
        assert found == names


def test_weights_count_every_occurrence() -> None:
    mod, params = load("repeated_blocks")
    tasks = extract_tasks(mod, X86, params)
    calls = []
    relay.analysis.post_order_visit(
        _fused_main("repeated_blocks", X86),
        lambda n: (
            calls.append(n)
            if isinstance(n, relay.Call) and isinstance(n.op, relay.Function)
            else None
        ),
    )
    assert sum(t.weight for t in tasks) == len(calls)
    assert all(t.weight == len(t.visits) == len(t.calls) for t in tasks)
    assert sorted(v for t in tasks for v in t.visits) == list(range(len(calls)))


def _fused_main(model: str, target: str) -> relay.Function:
    from relay_tasks.optimize.pipeline import PassSettings, extraction_scope, optimize

    mod, params = load(model)
    with extraction_scope(tvm.target.Target(target), PassSettings()):
        return optimize(mod, params)["main"]


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_each_tasks_function_is_typed_as_the_typed_fused_module_types_it(
    model: str, target: str
) -> None:
    """Extraction leaves the fused module untyped and types each task's function alone: every
    node of it has the type that inference over the whole fused module gives it."""
    from relay_tasks.optimize.pipeline import PassSettings, extraction_scope, optimize

    mod, params = load(model)
    tasks = extract_tasks(mod, target, params)
    with extraction_scope(tvm.target.Target(target), PassSettings()):
        typed = optimize(load(model)[0], params)
    fused: list[relay.Function] = []
    for func in typed.functions.values():
        relay.analysis.post_order_visit(
            func, lambda n: fused.append(n) if isinstance(n, relay.Function) else None
        )
    for task in tasks:
        twin = next(f for f in fused if tvm.ir.structural_equal(f, task.func))
        assert_typed_alike(task.func, twin)


def test_tasks_carry_te_compute_only() -> None:
    mod, params = load("dense_softmax")
    tasks = extract_tasks(mod, X86, params, pass_config=DEFAULT_PASS_CONFIG)
    upstream = oracles.meta_schedule("dense_softmax", X86)
    assert [t.name.replace(".", "_") for t in tasks] == [t.task_name for t in upstream]
    for task in tasks:
        assert all(isinstance(t.op, te.PlaceholderOp) for t in task.inputs)
        assert all(isinstance(t, te.Tensor) for t in task.outputs)
        assert str(task.target) == str(tvm.target.Target(X86))
        assert len(task.key) == 16


def _dense_strategy_with_broken_schedule(attrs, inputs, out_type, target):
    def broken_schedule(attrs, outs, target):
        raise RuntimeError("this TE schedule is broken")

    strategy = _op.OpStrategy()
    strategy.add_implementation(
        wrap_compute_dense(topi.nn.dense), broken_schedule, name="dense.broken", plevel=100
    )
    return strategy


@pytest.mark.parametrize("target", [X86, CUDA])
def test_a_broken_te_schedule_does_not_stop_extraction(target: str) -> None:
    """The motivating case: compiling fails in the schedule; extraction never calls it."""
    mod, params = load("dense_softmax")
    with TempOpAttr("nn.dense", "FTVMStrategy", _dense_strategy_with_broken_schedule):
        with (
            pytest.raises(Exception, match="this TE schedule is broken"),
            tvm.transform.PassContext(opt_level=3),
            cuda_injective_schedules(),
        ):
            relay.build(load("dense_softmax")[0], target=target, params=params)
        expected = ms.relay_integration.extract_tasks(
            load("dense_softmax")[0], tvm.target.Target(target), params
        )
        actual = extract_task_from_relay(mod, target, params)
    assert [t.task_name for t in actual] == [
        "fused_nn_dense_add_nn_relu",
        "fused_nn_dense_add",
        "fused_nn_softmax",
    ]
    assert_same_extracted_tasks(list(expected), actual)


def test_functions_for_an_external_compiler_are_not_tasks() -> None:
    annotated, params = partitioned_for_ccompiler()
    externals = [gv.name_hint for gv in annotated.get_global_vars() if gv.name_hint != "main"]
    assert externals, "the partitioning offloaded nothing; the test would prove nothing"
    assert_meta_schedule_matches(annotated, params, X86)
    for task in extract_tasks(annotated, X86, params):
        assert "Compiler" not in task.func.attrs
        assert "add" not in task.name


def _strategy_with_broken_compute(attrs, inputs, out_type, target):
    """A softmax whose TE compute itself raises (no pass asks for it: lowering to TE is
    where extraction fails)."""

    def compute(attrs, inputs, out_type):
        raise RuntimeError("this TE compute is broken")

    strategy = _op.OpStrategy()
    strategy.add_implementation(compute, lambda attrs, outs, target: None, name="broken")
    return strategy


def test_a_broken_te_compute_is_one_extraction_error_naming_target_and_cause() -> None:
    from relay_tasks import ExtractionError

    mod, params = load("dense_softmax")
    with (
        TempOpAttr("nn.softmax", "FTVMStrategy", _strategy_with_broken_compute),
        pytest.raises(ExtractionError) as caught,
    ):
        extract_tasks(mod, X86, params)
    message = str(caught.value)
    assert message.startswith("cannot lower a primitive function to TE compute for target llvm: ")
    assert "this TE compute is broken" in message


def test_disabled_passes_are_honoured() -> None:
    """AlterOpLayout is what turns x86 convolutions into NCHWc ones (and adds layout tasks)."""
    mod, params = load("conv_bias_bn_relu")
    default = [t.name for t in extract_tasks(mod, X86, params)]
    disabled = [t.name for t in extract_tasks(mod, X86, params, disabled_pass=["AlterOpLayout"])]
    assert any("NCHWc" in name for name in default)
    assert disabled and not any("NCHWc" in n or "layout_transform" in n for n in disabled)


def test_what_a_lowering_scope_records_is_kept_per_task() -> None:
    """A tuner's lowering scope is entered once per distinct function; what it records while
    that function is lowered is that task's ``traced``."""
    from contextlib import contextmanager

    lowered: list[str] = []

    @contextmanager
    def scope():
        record: list[str] = []
        yield record
        record.append(f"lowering {len(lowered)}")
        lowered.append("x")

    mod, params = load("repeated_blocks")
    request = Request.of(mod, X86, params, PassSettings())
    tasks = run_extraction(request, lowering_scope=scope)
    assert len(lowered) == len(tasks)
    assert sorted(t.traced for t in tasks) == [(f"lowering {i}",) for i in range(len(tasks))]


def test_a_function_only_other_functions_call_weighs_its_calls() -> None:
    """``block`` is called twice from main through a global function: it is in no walk of
    main, yet the compiler lowers it at each call."""
    from module_shapes import MODULE_SHAPES

    mod, params = MODULE_SHAPES["several_global_functions"]()
    tasks = extract_tasks(mod, X86, params)
    outside = [t for t in tasks if not t.visits]
    assert outside and all(t.weight == len(t.calls) >= 1 for t in outside)
    assert tasks[-len(outside) :] == outside  # after main's, in call order
    assert [t.calls[0] for t in outside] == sorted(t.calls[0] for t in outside)


def test_in_call_order_leaves_out_what_the_compiler_never_calls() -> None:
    from relay_tasks.lowering.extract import in_call_order

    def task(name: str, calls: tuple[int, ...]) -> Task:
        return Task(name, None, None, None, 1, name, (), calls)  # type: ignore[arg-type]

    tasks = [task("a", (3,)), task("b", ()), task("c", (0, 5)), task("d", (1,))]
    assert [t.name for t in in_call_order(tasks)] == ["c", "d", "a"]


def test_dynamic_shapes_are_found_and_spelled_with_question_marks() -> None:
    from relay_tasks.lowering.extract import display_name, dynamic_shape, shape_text

    assert shape_text([1, tvm.tir.IntImm("int64", 16)]) is None
    assert shape_text([tvm.tir.Any(), 16]) == "(?, 16)"
    assert shape_text([2, tvm.tir.Var("n", "int64"), 3]) == "(2, ?, 3)"
    x = relay.var("x", shape=(relay.Any(), 16))
    y = relay.var("y", shape=(4, 16))
    for params, body, expected in [
        ([x], relay.nn.relu(x), "(?, 16)"),
        ([y], relay.nn.relu(y), None),
        ([y], relay.Tuple([y, relay.reshape(y, (-1,))]), None),
        ([y, x], relay.Tuple([y, relay.nn.relu(x)]), "(?, 16)"),
    ]:
        func = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body)))
        assert dynamic_shape(func["main"]) == expected
    assert display_name(Task("fused_nn.dense_add", *[None] * 4, 1, "k", (), ())) == (  # type: ignore[arg-type]
        "fused_nn_dense_add"
    )


def test_a_dynamic_task_is_left_out_with_one_warning_naming_it() -> None:
    from relay_tasks import SkippedTaskWarning
    from relay_tasks.lowering.extract import warn_skipped_dynamic

    x = relay.var("x", shape=(relay.Any(), 16))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x)))
    (task,) = extract_tasks(mod, X86)
    with pytest.warns(SkippedTaskWarning) as warned:
        assert warn_skipped_dynamic(task, "Ansor") is True
    assert str(warned[0].message) == (
        "fused_nn_relu has the dynamic shape (?, 16): Ansor cannot tune it and it is left out, "
        "as upstream leaves it out; give the model static input shapes to tune it"
    )
    static, _ = load("dense_softmax")
    assert warn_skipped_dynamic(extract_tasks(static, X86)[0], "Ansor") is False


@pytest.mark.parametrize("tuner", ["meta_schedule", "ansor"])
def test_the_warning_points_at_the_callers_line(tuner: str) -> None:
    from relay_tasks import SkippedTaskWarning, extract

    x = relay.var("x", shape=(relay.Any(), 16))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x)))
    options = {"include_simple_tasks": True} if tuner == "ansor" else {}
    with pytest.warns(SkippedTaskWarning) as warned:
        line = sys._getframe().f_lineno + 1
        extract(mod, X86, tuner=tuner, **options)
    assert [(w.filename, w.lineno) for w in warned] == [(__file__, line)]


def test_a_tasks_key_is_its_functions_structural_hash_in_hex() -> None:
    """Keys identify functions across processes and models: 16 hex digits of the unsigned
    64-bit structural hash, so distinct functions have distinct keys."""
    mod, params = load("conv_bias_bn_relu")
    other, other_params = load("dense_softmax")
    tasks = extract_tasks(mod, X86, params) + extract_tasks(other, X86, other_params)
    for task in tasks:
        assert (
            len(task.key) == 16 and int(task.key, 16) == tvm.ir.structural_hash(task.func) % 2**64
        )
    assert len({t.key for t in tasks}) == len(tasks)
    again = extract_tasks(mod, X86, params)
    assert [t.key for t in again] == [t.key for t in tasks[: len(again)]]
