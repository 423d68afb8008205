"""``prune``: the best records of each task and a failure of each cause kept, the rest dropped,
all files of a tuner changed together or not at all, never under a running tune."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import relay_tasks
from relay_tasks.adapters import get_adapter
from relay_tasks.adapters.base import cause_lines
from relay_tasks.adapters.journal import append
from relay_tasks.cli import main
from relay_tasks.tuning import prune as pruning

from tuned_models import TUNERS, tune_argv


def _with_failures(work: Path, tuner: str, causes: list[str]) -> None:
    """Append a failed copy of the first record per cause, with its cause (and its time), as
    the tuner's writer would."""
    files = get_adapter(tuner).files
    first = json.loads((work / files.records).read_text().splitlines()[0])
    if tuner == "autotvm":
        first["result"][:2] = [[1e9], 4]  # RUNTIME_DEVICE
    elif tuner == "ansor":
        first["r"][:2] = [[1e10], 4]
    else:
        first[1][1] = [1e10]  # MetaSchedule's mark of a failed run
    lines = [
        (files.records, [json.dumps(first)] * len(causes)),
        (files.causes, cause_lines(causes)),
    ]
    if files.times:
        lines.append((files.times, [json.dumps({"t": 1.5e9})] * len(causes)))
    append(work, lines)


def _by_task(measured) -> dict[str, tuple[list[float], list[str]]]:
    """Per task: its valid latencies, fastest first, and its failures' causes in order."""
    tasks: dict[str, tuple[list[float], list[str]]] = {}
    for m in measured:
        valid, failed = tasks.setdefault(m.key, ([], []))
        (valid.append(m.seconds) if m.valid else failed.append(m.error))
    return {k: (sorted(v), f) for k, (v, f) in tasks.items()}


@pytest.mark.parametrize("tuner", TUNERS)
def test_prune_keeps_the_best_of_each_task_and_a_failure_of_each_cause(
    tuner: str, tiny, tuned: dict[str, Path], tmp_path: Path, capsys
) -> None:
    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    _with_failures(work, tuner, ["device lost", "device lost", "out of memory"])
    adapter = get_adapter(tuner)
    before = adapter.measurements(work)
    size = sum(os.path.getsize(work / name) for name in adapter.files.matched)
    assert main(["prune", "--work-dir", str(work), "--keep", "1"]) == 0
    after = adapter.measurements(work)
    expected = {key: (valid[:1], list(dict.fromkeys(failed)))
                for key, (valid, failed) in _by_task(before).items()}  # fmt: skip
    assert _by_task(after) == expected
    # Each kept record keeps its time and its place in the order.
    rest = iter(before)
    assert all(any(m == earlier for earlier in rest) for m in after)
    new_size = sum(os.path.getsize(work / name) for name in adapter.files.matched)
    assert capsys.readouterr().out == (
        f"pruned {work}: kept {len(after)} of {len(before)} records ({len(before) - len(after)} "
        f"dropped, {size - new_size:,} of {size:,} bytes freed)\n"
    )
    assert not list(work.glob("*" + pruning.NEW_SUFFIX)) and not (work / pruning.MARKER).exists()
    # What was kept is what a resumed tune and a build read.
    assert main([*tune_argv(tiny, tuner, work, len(adapter.measurements(work)) + 1)]) == 0


def test_a_prune_cut_short_is_finished_or_undone_by_the_next_command(
    tuned: dict[str, Path], tmp_path: Path, monkeypatch
) -> None:
    """A crash after the marker: the next reader finishes every rename (records, causes and
    times stay matched); before it: the old files stand and the new ones are removed."""
    adapter = get_adapter("meta_schedule")
    clean = tmp_path / "clean"
    shutil.copytree(tuned["meta_schedule"], clean)
    _with_failures(clean, "meta_schedule", ["a", "b"])
    crashed = tmp_path / "crashed"
    shutil.copytree(clean, crashed)
    pruning.prune(adapter, clean, 1)
    renamed = []

    def crash_after_one(source, target) -> None:
        if renamed:
            raise KeyboardInterrupt  # the process dies between two renames
        renamed.append(target)
        os.replace(source, target)

    monkeypatch.setattr(pruning.os, "rename", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        pruning.prune(adapter, crashed, 1)
    monkeypatch.undo()
    assert (crashed / pruning.MARKER).exists() and len(renamed) == 1
    assert main(["status", "--work-dir", str(crashed)]) == 0  # finishes the prune first
    for name in adapter.files.matched:
        assert (crashed / name).read_bytes() == (clean / name).read_bytes(), name
    assert not (crashed / pruning.MARKER).exists()

    untouched = tmp_path / "untouched"
    shutil.copytree(tuned["meta_schedule"], untouched)
    _with_failures(untouched, "meta_schedule", ["a"])
    old = {name: (untouched / name).read_bytes() for name in adapter.files.matched}

    def crash_before_marker(folder, names) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pruning, "_write_marker", crash_before_marker)
    with pytest.raises(KeyboardInterrupt):
        pruning.prune(adapter, untouched, 1)
    monkeypatch.undo()
    assert list(untouched.glob("*" + pruning.NEW_SUFFIX))
    assert main(["status", "--work-dir", str(untouched)]) == 0
    assert {name: (untouched / name).read_bytes() for name in adapter.files.matched} == old
    assert not list(untouched.glob("*" + pruning.NEW_SUFFIX))


def test_prune_is_refused_while_a_tune_runs(tuned: dict[str, Path], tmp_path: Path, capsys) -> None:
    work = tmp_path / "work"
    shutil.copytree(tuned["autotvm"], work)
    before = (work / "autotvm.log").read_bytes()
    with pruning.tuning(work):  # as every running tune holds it
        code = main(["prune", "--work-dir", str(work), "--keep", "1"])
    assert code == relay_tasks.TuningError.exit_code
    assert capsys.readouterr().err == (
        f"relay-tasks: error: a tune is running in {work}; prune it when that tune ends "
        "(pruning rewrites the files it appends to)\n"
    )
    assert (work / "autotvm.log").read_bytes() == before
    assert (
        main(["prune", "--work-dir", str(work), "--keep", "0"]) == relay_tasks.UsageError.exit_code
    )


def test_a_forged_marker_renames_nothing(tuned: dict[str, Path], tmp_path: Path, capsys) -> None:
    """A marker is data: one naming a file outside the tuner's record files is refused, and
    nothing is renamed over the work dir's task file."""
    work = tmp_path / "work"
    shutil.copytree(tuned["autotvm"], work)
    (work / "tasks.json.pruned").write_text("{}")
    (work / pruning.MARKER).write_text(json.dumps(["tasks.json"]))
    before = (work / "tasks.json").read_bytes()
    assert main(["status", "--work-dir", str(work)]) == relay_tasks.TuningError.exit_code
    assert "is damaged; remove it" in capsys.readouterr().err
    assert (work / "tasks.json").read_bytes() == before


@pytest.mark.parametrize("tuner", TUNERS)
def test_export_writes_the_best_records_that_tvms_own_readers_take(
    tuner: str, tuned: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """What tvmc users ship: the fastest valid record of each task, in the tuner's format,
    read back by TVM's own reader (not ours) with the same latencies."""
    import numpy as np
    from tvm import auto_scheduler, autotvm
    from tvm import meta_schedule as ms

    work, out = tuned[tuner], tmp_path / "best"
    assert main(["export", "--work-dir", str(work), "-o", str(out)]) == 0
    best: dict[str, float] = {}
    for m in get_adapter(tuner).measurements(work):
        if m.valid:
            best[m.key] = min(best.get(m.key, np.inf), m.seconds)
    if tuner == "autotvm":
        read = [float(np.mean(res.costs)) for _, res in autotvm.record.load_from_file(str(out))]
    elif tuner == "ansor":
        read = [float(np.mean([c.value for c in res.costs]))
                for _, res in auto_scheduler.load_records(str(out))]  # fmt: skip
    else:
        database = ms.database.JSONDatabase(
            path_workload=str(out / "database_workload.json"),
            path_tuning_record=str(out / "database_tuning_record.json"),
            allow_missing=False,
        )
        read = [float(np.mean([float(s) for s in r.run_secs]))
                for r in database.get_all_tuning_records()]  # fmt: skip
    assert sorted(read) == pytest.approx(sorted(best.values()))
    assert capsys.readouterr().out == f"{len(best)} {tuner} records (the best 1 a task) in {out}\n"
    assert main(["export", "--work-dir", str(work), "-o", str(tmp_path / "no" / "log")]) == (
        relay_tasks.UsageError.exit_code
    )
