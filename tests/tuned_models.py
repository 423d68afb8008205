"""A tiny model (dense + relu), argv to tune it, and the tuners' logs read straight from disk.

Measurements are read from the raw logs here, not through the adapters under test.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import tvm
from tvm import relay

TUNERS = ("meta_schedule", "autotvm", "ansor")
#: Every tuner for a fault test that runs whole tunes (15-40 s a tuner): MetaSchedule in the
#: default run, the others in the slow tier, so the default run stays under 15 minutes.
TUNERS_ONE_FAST = (TUNERS[0], *(pytest.param(t, marks=pytest.mark.slow) for t in TUNERS[1:]))


def tune_argv(tiny: tuple[Path, Path], tuner: str, work: Path, trials: int) -> list[str]:
    text, params = tiny
    return ["tune", str(text), "--params", str(params), "--tuner", tuner,
            "--work-dir", str(work), "--trials", str(trials)]  # fmt: skip


def _raw_timings(work: Path, tuner: str) -> list[tuple[str, list[float], bool]]:
    """(task, its timings, whether the run was valid) per record, read straight from the
    tuner's log."""
    rows: list[tuple[str, list[float], bool]] = []
    if tuner == "autotvm":
        for line in (work / "autotvm.log").read_text().splitlines():
            record = json.loads(line)
            costs, error_no = record["result"][0], record["result"][1]
            task = record["input"][1] + json.dumps(record["input"][2])
            rows.append((task, costs, error_no == 0))
    elif tuner == "ansor":
        for line in (work / "ansor.json").read_text().splitlines():
            record = json.loads(line)
            costs, error_no = record["r"][0], record["r"][1]
            rows.append((record["i"][0][0], costs, error_no == 0))
    else:
        workloads = (work / "database_workload.json").read_text().splitlines()
        for line in (work / "database_tuning_record.json").read_text().splitlines():
            index, (_, run_secs, *_) = json.loads(line)
            rows.append((workloads[index][:40], run_secs, float(np.mean(run_secs)) < 1e9))
    return rows


def raw_measurements(work: Path, tuner: str) -> list[tuple[str, float | None]]:
    """(task, seconds or None when failed) per record, read straight from the tuner's log."""
    return [(task, float(np.mean(costs)) if valid else None)
            for task, costs, valid in _raw_timings(work, tuner)]  # fmt: skip


def timings_of_valid(work: Path, tuner: str) -> list[int]:
    """How many timings each valid measurement of the tuner's log averages."""
    return [len(costs) for _, costs, valid in _raw_timings(work, tuner) if valid]


def valid_count(work: Path, tuner: str) -> int:
    return sum(1 for _, s in raw_measurements(work, tuner) if s is not None and np.isfinite(s))


def valid_count_or_zero(work: Path, tuner: str) -> int:
    """``valid_count`` of a log being written: 0 before it exists or while a line is half
    written."""
    try:
        return valid_count(work, tuner)
    except (FileNotFoundError, ValueError, IndexError):
        return 0


def write_tiny(folder: Path, batch: int = 1) -> tuple[Path, Path]:
    """``m.relay`` and ``m.params``: dense (``batch``x32 by 16x32) + relu, seeded weights."""
    data, weight = relay.var("data", shape=(batch, 32)), relay.var("w", shape=(16, 32))
    body = relay.nn.relu(relay.nn.dense(data, weight))
    mod = tvm.IRModule.from_expr(relay.Function([data, weight], body))
    text, params = folder / "m.relay", folder / "m.params"
    text.write_text(mod.astext())
    params.write_bytes(relay.save_param_dict({"w": tiny_weight()}))
    return text, params


def write_other(folder: Path) -> tuple[Path, Path]:
    """``other.relay`` and ``other.params``: dense 1x32 by 8x32, not the tiny model's task."""
    data, weight = relay.var("data", shape=(1, 32)), relay.var("v", shape=(8, 32))
    mod = tvm.IRModule.from_expr(relay.Function([data, weight], relay.nn.dense(data, weight)))
    text, params = folder / "other.relay", folder / "other.params"
    text.write_text(mod.astext())
    params.write_bytes(relay.save_param_dict({"v": tvm.nd.array(np.ones((8, 32), "float32"))}))
    return text, params


def tiny_weight() -> np.ndarray:
    """The tiny model's seeded dense weight."""
    return np.random.default_rng(0).standard_normal((16, 32)).astype("float32")


class InProcess(NamedTuple):
    records: list[tuple[str, float | None]]
    build: Callable[[], Any]
    inputs: tuple[Any, Any, Any, Any]  # the module, target, params and tasks tuned


def tune_in_process(tuner: str, folder: Path, budgets: Sequence[int], batch: int = 1) -> InProcess:
    """The adapter's own ``tune``, in passes as the tuning worker runs it, on the tiny model's
    tasks in this process (the CLI tunes in a child, where a mutation tool's changes do not
    reach), to each budget in turn (the later ones resume): the raw records it left, and how
    the adapter builds the model with them."""
    import relay_tasks
    from relay_tasks.adapters import get_adapter
    from relay_tasks.adapters.base import Runner
    from relay_tasks.loaders import load_model
    from relay_tasks.tuning.worker import tune_until

    text, weights = write_tiny(folder, batch)
    mod, params = load_model(text, params=weights)
    target = relay_tasks.host_target()
    adapter = get_adapter(tuner)
    tasks = adapter.extract(mod, target, params)
    work = folder / "work"
    work.mkdir()
    for trials in budgets:
        tune_until(adapter, tasks, target, trials, work, Runner())
    return InProcess(
        raw_measurements(work, tuner),
        lambda: adapter.build(mod, target, params, work, tasks),
        (mod, target, params, tasks),
    )


def assert_runs_as_numpy(library: Any, batch: int = 1) -> None:
    """The tiny model built into ``library`` gives numpy's answer on this CPU."""
    from tvm.contrib import graph_executor

    data = np.random.default_rng(1).standard_normal((batch, 32)).astype("float32")
    graph = graph_executor.GraphModule(library["default"](tvm.cpu(0)))
    graph.set_input("data", data)
    graph.run()
    expected = np.maximum(data @ tiny_weight().T, 0)
    np.testing.assert_allclose(graph.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-5)


def assert_one_task_tunes_resumes_and_builds(tuner: str, folder: Path) -> None:
    """A tuner with a scheduler (MetaSchedule, Ansor) on the tiny model's one task: each pass
    measures what is missing in one round, so exactly 2, then 2 more; then the build. Each
    measurement is timed as :data:`relay_tasks.adapters.base.TIMING` says (the tuners' own
    default, one timing of 100 ms, cost twice as much)."""
    from relay_tasks.adapters.base import TIMING

    tuned = tune_in_process(tuner, folder, [2, 4])
    valid = [s for _, s in tuned.records if s is not None]
    assert len(valid) == 4 and all(0 < s < 1 for s in valid)
    assert timings_of_valid(folder / "work", tuner) == [TIMING.repeat] * 4
    assert_runs_as_numpy(tuned.build())
