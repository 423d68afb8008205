"""A build applies a record only where its schedule computes what its task computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tvm
from tvm import te, tir

from relay_tasks import RelayTasksWarning, host_target
from relay_tasks.adapters import ansor, autotvm, verify
from relay_tasks.adapters.autotvm import library as autotvm_build
from relay_tasks.adapters.verify import same_results


def _dense_relu(shift: float = 0.0) -> tvm.IRModule:
    a, b = te.placeholder((4, 16), name="a"), te.placeholder((8, 16), name="b")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((4, 8), lambda i, j: te.sum(a[i, k] * b[j, k], axis=k), name="c")
    d = te.compute((4, 8), lambda i, j: te.max(c[i, j] + shift, 0.0), name="d")
    return tvm.IRModule({"main": te.create_prim_func([a, b, d])})


def test_a_schedule_agrees_with_its_compute_and_another_compute_does_not() -> None:
    reference = _dense_relu()
    schedule = tir.Schedule(reference)
    i, j, k = schedule.get_loops(schedule.get_block("c"))
    outer, inner = schedule.split(k, [None, 4])
    schedule.reorder(i, outer, j, inner)
    schedule.vectorize(schedule.get_loops(schedule.get_block("d"))[-1])
    assert same_results(reference, schedule.mod, host_target())
    assert not same_results(reference, _dense_relu(shift=1.0), host_target())


@pytest.mark.xdist_group("tuning")
def test_a_tune_files_a_candidate_computing_something_else_as_a_failure(
    tmp_path: Path, monkeypatch
) -> None:
    """Each candidate faster than its task's best so far made to disagree as it is measured
    (the task's expected results shifted by one): none is kept as valid, each is a failure
    naming the miscompile, so no build can take one. (Unpatched, candidates that compute right
    pass: every tune test that counts valid measurements runs the check.)"""
    import json

    from relay_tasks.adapters.meta_schedule import database, runner

    from tuned_models import tune_in_process

    shifted = verify.results
    monkeypatch.setattr(runner, "results",
                        lambda mod, target: [a + 1 for a in shifted(mod, target)])  # fmt: skip
    tuned = tune_in_process("meta_schedule", tmp_path, [2])
    assert tuned.records and all(seconds is None for _, seconds in tuned.records)
    causes = [json.loads(line)["error"]
              for line in (tmp_path / "work" / database.ERRORS).read_text().splitlines()]  # fmt: skip
    assert causes == [runner.WRONG] * len(tuned.records)


@pytest.mark.xdist_group("tuning")
def test_a_record_computing_something_else_is_passed_over(tmp_path: Path, monkeypatch) -> None:
    """The tiny model's best record made to disagree (TVM's code for a schedule can be wrong:
    see relay_tasks/adapters/verify.py): the build takes the next best, or with every record
    disagreeing TVM's default schedule, says so, and computes numpy's answer either way."""
    from tuned_models import assert_runs_as_numpy, tune_in_process

    tuned = tune_in_process("meta_schedule", tmp_path, [4])
    agree = verify.agrees_with
    checked: list[Any] = []

    def first_disagrees(expected: Any, scheduled: Any, target: Any) -> bool:
        checked.append(scheduled)
        return len(checked) > 1 and agree(expected, scheduled, target)

    monkeypatch.setattr(verify, "agrees_with", first_disagrees)
    with pytest.warns(RelayTasksWarning, match="the best 1 of its records .* its next best"):
        assert_runs_as_numpy(tuned.build())
    monkeypatch.setattr(verify, "agrees_with", lambda *args: False)
    with pytest.warns(RelayTasksWarning, match="the best 4 of its records .* default schedule"):
        assert_runs_as_numpy(tuned.build())


@pytest.mark.xdist_group("tuning")
def test_a_record_flattening_the_weight_is_passed_over(tmp_path: Path) -> None:
    """The tiny model's best record with its weight rewritten into one dimension (16x32 to
    512, filed ten times faster): it computes right alone, and a model built with it failed in
    TOPI's dense ("1-dim matmul is not supported yet"; a 3-trial tune of the tests found one).
    The build passes it over for the next best, says so, and computes numpy's answer."""
    import json

    from tuned_models import assert_runs_as_numpy, tune_in_process

    tuned = tune_in_process("meta_schedule", tmp_path, [3])
    records = tmp_path / "work" / "database_tuning_record.json"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    best = min(lines, key=lambda line: float(sum(line[1][1])))
    flat = tvm.ir.save_json(tir.IndexMap.from_func(lambda i, k: [i * 32 + k]))
    layouts = [step for step in best[1][0][0] if step[0] == "TransformLayout"]
    assert layouts  # MetaSchedule rewrites the dense's weight
    for step in layouts:
        step[1][1] = flat
    best[1][1] = [seconds / 10 for seconds in best[1][1]]
    with open(records, "a") as file:
        file.write(json.dumps(best) + "\n")
    with pytest.warns(RelayTasksWarning, match="1 of its best records rewrite a weight matrix"):
        assert_runs_as_numpy(tuned.build())


@pytest.mark.xdist_group("tuning")
@pytest.mark.parametrize("adapter", [ansor, autotvm], ids=["ansor", "autotvm"])
def test_an_ansor_state_or_autotvm_config_computing_something_else_is_passed_over(
    adapter: Any, tmp_path: Path, monkeypatch
) -> None:
    """As for MetaSchedule: each checked state (config) is the tiny model's, applied to its
    compute DAG (template), and agrees unpatched; a disagreeing best gives way to the next,
    and with every one disagreeing the build takes TVM's default schedule, saying so."""
    from tuned_models import assert_runs_as_numpy, tune_in_process

    tuned = tune_in_process(adapter.NAME, tmp_path, [4])
    assert sum(1 for _, s in tuned.records if s is not None) >= 2
    agree = verify.agrees_with
    checked: list[bool] = []

    def first_disagrees(expected: Any, scheduled: Any, target: Any) -> bool:
        checked.append(agree(expected, scheduled, target))
        return len(checked) > 1 and checked[-1]

    monkeypatch.setattr(verify, "agrees_with", first_disagrees)
    with pytest.warns(RelayTasksWarning, match="the best 1 of its records .* its next best"):
        assert_runs_as_numpy(tuned.build())
    assert checked[:2] == [True, True]
    monkeypatch.setattr(verify, "agrees_with", lambda *args: False)
    with pytest.warns(RelayTasksWarning, match="of its records .* default schedule"):
        assert_runs_as_numpy(tuned.build())


#: An Ansor state of ``dense + 1`` (8x32 by 16x32) that Ansor measured valid (0.13 ms) on this
#: TVM build, and whose code computes NaN: found by the check this file tests.
_WRONG_STATE = [
    ["CI", 3], ["SP", 2, 0, 8, [2, 2, 2], 1], ["SP", 2, 4, 16, [1, 2, 2], 1],
    ["SP", 2, 8, 32, [4], 1], ["RE", 2, [0, 4, 1, 5, 8, 2, 6, 9, 3, 7]], ["FSP", 4, 0, 1, 2],
    ["FSP", 4, 3, 2, 2], ["RE", 4, [0, 3, 1, 4, 2, 5]], ["CA", 2, 4, 3], ["FU", 4, [0, 1, 2, 3]],
    ["AN", 4, 0, 3], ["PR", 2, 0, "auto_unroll_max_step$64"], ["AN", 2, 9, 2], ["AN", 4, 2, 2],
]  # fmt: skip


@pytest.mark.xdist_group("tuning")
def test_an_ansor_state_measured_valid_that_computes_nan_is_not_built(tmp_path: Path) -> None:
    import json

    import numpy as np
    from tvm import relay
    from tvm.contrib import graph_executor

    from relay_tasks.adapters import get_adapter

    x, w = relay.var("x", shape=(8, 32)), relay.var("w", shape=(16, 32))
    body = relay.add(relay.nn.dense(x, w), relay.const(1.0))
    mod = tvm.IRModule.from_expr(relay.Function([x, w], body))
    target, adapter = host_target(), get_adapter("ansor")
    (task,) = adapter.extract(mod, target, {})
    record = {"i": [[task.native.workload_key, str(target), [1, 64, 64, 0, 0, 0, 0, 0], "", 0, []],
                    [[], _WRONG_STATE]],
              "r": [[0.00013358], 0, 3.22916, 1796297714], "v": "v0.6"}  # fmt: skip
    (tmp_path / "ansor.json").write_text(json.dumps(record) + "\n")
    with pytest.warns(RelayTasksWarning, match="the best 1 of its records .* default schedule"):
        library = adapter.build(mod, target, {}, tmp_path, [task])
    rng = np.random.default_rng(3)
    xv, wv = rng.standard_normal((8, 32)), rng.standard_normal((16, 32))
    graph = graph_executor.GraphModule(library["default"](tvm.cpu(0)))
    graph.set_input("x", xv.astype("float32"))
    graph.set_input("w", wv.astype("float32"))
    graph.run()
    np.testing.assert_allclose(graph.get_output(0).numpy(), xv @ wv.T + 1, rtol=1e-4, atol=1e-4)


def test_an_autotvm_config_that_chooses_the_layouts_is_checked_in_its_own(tmp_path: Path):
    """``conv2d_NCHWc``'s channel blocks come from its config and shape its buffers: a
    record whose blocks are not the fallback config's is checked against the template's
    compute in its own layouts (DCGAN's AutoTVM build failed comparing a (1, 8, 8, 8, 64)
    output with the fallback's (1, 32, 8, 8, 16)), kept where it agrees, and passed over
    where its code computes something else."""
    import time

    from tvm import autotvm as tvm_autotvm
    from tvm import relay

    data, weight = relay.var("data", shape=(1, 32, 8, 8)), relay.var("w", shape=(64, 32, 3, 3))
    body = relay.nn.conv2d(data, weight, padding=(1, 1), channels=64, kernel_size=(3, 3))
    mod = tvm.IRModule.from_expr(relay.Function([data, weight], body))
    target = host_target()
    (task,) = autotvm.extract(mod, target, {})
    space = task.native.config_space
    index = next(i for i in range(len(space)) if space.get(i)["tile_oc"].size[-1] == 64)
    config = space.get(index)
    measured = tvm_autotvm.MeasureInput(target, task.native, config)
    result = tvm_autotvm.MeasureResult([1e-4], 0, 0.1, time.time())
    line = tvm_autotvm.record.encode(measured, result)
    log = tmp_path / "autotvm.log"
    log.write_text(line + "\n")
    assert autotvm_build._agreeing(log, [task], target) == [(task, line + "\n")]
    native = autotvm.create_task(task.native.name, task.native.args, target)
    shapes = autotvm_build._buffer_shapes(autotvm_build._lowered(native, config, target))
    fallback = autotvm_build._lowered(native, autotvm_build.FallbackConfigEntity(), target)
    assert shapes != autotvm_build._buffer_shapes(fallback)  # its layouts are not the fallback's
    lowered = autotvm_build._lowered

    def shifted(native: Any, config: Any, target: Any, *, plain: bool = False) -> Any:
        """The record's schedule made to compute the compute plus one."""
        mod = lowered(native, config, target, plain=plain)
        if plain:
            return mod
        func = mod["main"]
        out = func.buffer_map[func.params[-1]]
        return tvm.IRModule({"main": func.with_body(tir.SeqStmt([func.body, _add_one(out)]))})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotvm_build, "_lowered", shifted)
        with pytest.warns(RelayTasksWarning, match="the best 1 of its records .* default"):
            assert autotvm_build._agreeing(log, [task], target) == []


def _add_one(buffer: Any) -> Any:
    """A loop nest adding 1 to every element of ``buffer``."""
    loops = [tir.Var(f"i{n}", "int32") for n in range(len(buffer.shape))]
    store = tir.BufferStore(buffer, tir.BufferLoad(buffer, loops) + 1.0, loops)
    for var, extent in reversed(list(zip(loops, buffer.shape, strict=True))):
        store = tir.For(var, 0, extent, tir.ForKind.SERIAL, store)
    return store
