"""A build applies a record only where its schedule computes what its task computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tvm
from tvm import te, tir

from relay_tasks import RelayTasksWarning, host_target
from relay_tasks.adapters import meta_schedule
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
def test_a_record_computing_something_else_is_passed_over(tmp_path: Path, monkeypatch) -> None:
    """The tiny model's best record made to disagree (TVM's code for a schedule can be wrong:
    see relay_tasks/adapters/verify.py): the build takes the next best, or with every record
    disagreeing TVM's default schedule, says so, and computes numpy's answer either way."""
    from tuned_models import assert_runs_as_numpy, tune_in_process

    tuned = tune_in_process("meta_schedule", tmp_path, [4])
    agree = meta_schedule.agrees_with
    checked: list[Any] = []

    def first_disagrees(expected: Any, scheduled: Any, target: Any) -> bool:
        checked.append(scheduled)
        return len(checked) > 1 and agree(expected, scheduled, target)

    monkeypatch.setattr(meta_schedule, "agrees_with", first_disagrees)
    with pytest.warns(RelayTasksWarning, match="the best 1 of its records .* its next best"):
        assert_runs_as_numpy(tuned.build())
    monkeypatch.setattr(meta_schedule, "agrees_with", lambda *args: False)
    with pytest.warns(RelayTasksWarning, match="the best 4 of its records .* default schedule"):
        assert_runs_as_numpy(tuned.build())
