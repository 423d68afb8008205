"""The shared backend: compile-cache dedup, weights, order, and no schedule ever applied."""

from __future__ import annotations

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

import oracles
from checks import assert_meta_schedule_matches, assert_same_extracted_tasks
from cuda_schedules import cuda_injective_schedules
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
    from relay_tasks.pipeline import PassSettings, extraction_scope, optimize

    mod, params = load(model)
    with extraction_scope(tvm.target.Target(target), PassSettings()):
        return optimize(mod, params)["main"]


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
