"""``compile`` chooses each task's way by its time inside the model, keeps the choice while its
records stand, and reads it back through an allowlist."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from relay_tasks.adapters.meta_schedule import library
from relay_tasks.adapters.meta_schedule.database import WorkDatabase
from relay_tasks.cli import main
from relay_tasks.errors import ModelError, TuningError
from relay_tasks.loaders import load_model
from relay_tasks.tuning import choose
from relay_tasks.tuning import compile as building

from tuned_models import raw_measurements


def _tasks(*keys: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(key=key) for key in keys]


def test_each_task_takes_the_record_its_calls_ran_fastest_with_in_the_model() -> None:
    """Seconds by task in the builds of every task's fastest record, second and third: a task
    changes only where another record beat its fastest, not one built with TVM's default (a
    default convolution changes the layouts around it), nor past the records it has."""
    a, b, c, d, e = tasks = _tasks("a", "b", "c", "d", "e")
    plan = SimpleNamespace(applied=[a, b, c, e], tuned=tasks, slower=[d])
    times = [
        {"a": 1.0, "b": 1.0, "c": 0.5, "d": 0.5, "e": 0.3},  # the fastest records (d default)
        {"a": 0.8, "b": 1.1, "c": 0.6, "d": 0.4, "e": 0.2},  # each task's second
        {"a": 0.9, "b": 0.7, "c": 0.7, "d": 0.3, "e": 0.2},  # each task's third
    ]
    records = {key: 5 for key in "abcd"} | {"e": 1}
    assert choose.fastest(times, plan, records) == {"a": 1, "b": 2}
    assert choose.fastest(times, plan, {**records, "b": 2}) == {"a": 1}
    assert choose.fastest([{}, *times[1:]], plan, records) == {}  # no time for its own


def test_a_rank_builds_a_task_from_its_next_fastest_record(tuned, tiny) -> None:
    """MetaSchedule's build takes a task's ``rank``-th fastest record (that computes right)."""
    work = tuned["meta_schedule"]
    mod, params = load_model(tiny[0], params=tiny[1])
    chosen = building.plan(mod, params, work)
    (task,) = chosen.tasks
    valid = sorted(s for _, s in raw_measurements(work, "meta_schedule") if s is not None)
    assert len(valid) >= 2
    for rank in range(len(valid)):
        memory = WorkDatabase(work, [task.native.dispatched[0]], keep=5).memory
        checked, kept = library._agreeing(memory, [task], chosen.target, {task.key: rank})
        (record,) = checked.get_all_tuning_records()
        assert kept == [task]
        assert float(np.mean([float(s) for s in record.run_secs])) == pytest.approx(valid[rank])


def _copy(work: Path, tmp_path: Path) -> Path:
    """The work dir, without its default latencies: its task is built with its records (a
    random record can lose to TOPI's default alone, and such a task is not chosen for)."""
    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    (copy / "defaults.jsonl").unlink()
    return copy


def _plan(tiny, work: Path):
    mod, params = load_model(tiny[0], params=tiny[1])
    return building.plan(mod, params, work)


def test_a_choice_is_recalled_while_what_it_was_chosen_from_stands(
    tuned, tiny, tmp_path, monkeypatch
) -> None:
    work = _copy(tuned["meta_schedule"], tmp_path)
    chosen = _plan(tiny, work)
    (task,) = chosen.tasks
    choose._write(work, choose.digest(chosen, work), {task.key: 1}, [2.0, 1.5])
    recalled = choose.recall(chosen, work)
    assert (recalled.ranks, recalled.in_model) == ({task.key: 1}, True)
    assert recalled.applied == [task]
    assert "as timed in the model by an earlier compile, 1 built with another" in (
        recalled.describe()
    )
    # A rank for a task the plan builds with TVM's default is not taken.
    default = dataclasses.replace(chosen, slower=[task])
    choose._write(work, choose.digest(default, work), {task.key: 1}, [2.0, 1.5])
    assert choose.recall(default, work).ranks == {}
    choose._write(work, choose.digest(chosen, work), {task.key: 1}, [2.0, 1.5])
    # Another host (its target), or a record among the task's fastest, makes it stale.
    monkeypatch.setattr(choose, "host_target", lambda: "llvm -mcpu=another")
    assert choose.recall(chosen, work) == chosen
    monkeypatch.undo()
    assert choose.recall(chosen, work).in_model
    records = work / "database_tuning_record.json"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    fastest = min(lines, key=lambda line: float(np.mean(line[1][1])))
    faster = [fastest[0], [fastest[1][0], [min(fastest[1][1]) / 2], *fastest[1][2:]]]
    with open(records, "a") as file:
        file.write(json.dumps(faster) + "\n")
    fresh = _plan(tiny, work)
    assert fresh.best[task.key] < chosen.best[task.key]
    assert choose.recall(fresh, work) == fresh


@pytest.mark.parametrize(
    "entry",
    [
        {"ranks": {"KEY": 3}},  # past the ranks a choice tries: a record it never timed
        {"ranks": {"KEY": 0}},
        {"ranks": {"KEY": True}},
        {"ranks": {"KEY": -1}},
        {"ranks": {"../../KEY": 1}},
        {"ranks": {"KEY": 1}, "extra": 1},
        {"ranks": {"KEY": 1}, "ms": [float("nan"), 1.0]},
        {"ranks": {"KEY": 1}, "digest": "DIGEST\n"},
    ],
)
def test_a_choice_file_is_read_through_an_allowlist(tuned, tiny, tmp_path, entry) -> None:
    """Attack: ``chosen.json`` travels with the work dir. A file under the right digest that
    is not what compile writes chooses nothing (the choice is made again): a build never takes
    a record past the ranks timed in the model on this host."""
    work = _copy(tuned["meta_schedule"], tmp_path)
    chosen = _plan(tiny, work)
    (task,) = chosen.tasks
    stamp = choose.digest(chosen, work)
    written = {"digest": stamp, "ranks": {}, "ms": [2.0, 1.5], **entry}
    text = json.dumps(written).replace("KEY", task.key).replace("DIGEST", stamp)
    (work / choose.CHOSEN_FILE).write_text(text)
    assert choose.recall(chosen, work) == chosen
    (work / choose.CHOSEN_FILE).write_text(text.replace(', "extra": 1', ""))
    if "extra" in entry:  # the same file without the extra field is taken
        assert choose.recall(chosen, work).ranks == {task.key: 1}


def test_a_planted_fifo_is_refused_not_waited_on(tuned, tiny, tmp_path) -> None:
    work = _copy(tuned["meta_schedule"], tmp_path)
    os.mkfifo(work / choose.CHOSEN_FILE)
    chosen = _plan(tiny, work)
    with pytest.raises(ModelError, match="chosen.json is not a regular file .* remove it"):
        choose.recall(chosen, work)


def _faster_at(rank_index: int, factor: float):
    """``profiles`` as TVM's debug executor times them, the build at ``rank_index`` scaled."""
    real = building.profiles

    def profiles(factories, inputs):
        shares = real(factories, inputs)
        shares[rank_index] = [dataclasses.replace(s, seconds=s.seconds * factor)
                              for s in shares[rank_index]]  # fmt: skip
        return shares

    return profiles


#: Kept as the default run's; a choice the whole model runs slower with is let go in the slow
#: tier (30 s a row; the confirming comparison is the same code either way).
@pytest.mark.parametrize("faster_as_a_whole", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_compile_builds_each_task_the_way_it_ran_fastest_and_keeps_that(
    tuned, tiny, tmp_path, monkeypatch, capsys, faster_as_a_whole
) -> None:
    """The task's second fastest record ran fastest in the model (made so): compile builds it
    so where the model built so is faster as a whole (made so, either way), keeps the choice,
    and the next compile builds once with it; ``--no-choose`` ignores it."""
    work = _copy(tuned["meta_schedule"], tmp_path)
    monkeypatch.setattr(choose, "MIN_SECONDS", 0.0)  # the tiny model runs in microseconds
    monkeypatch.setattr(choose, "profiles", _faster_at(1, 0.01))
    real = building.compare

    def compare(factories, inputs, **kwargs):  # the times of the first, halved or doubled
        ran, mixed = real(factories, inputs, **kwargs)
        seconds = [s * (0.5 if faster_as_a_whole else 2.0) for s in ran.repeats]
        return [ran, dataclasses.replace(mixed, repeats=seconds)]

    monkeypatch.setattr(choose, "compare", compare)
    text, params = tiny
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(tmp_path / "model.so")]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "relay-tasks: timing each task's 3 fastest records inside the model" in err
    assert "1 task(s) ran faster inside the model with another of their records" in err
    (task,) = _plan(tiny, work).tasks
    kept = json.loads((work / choose.CHOSEN_FILE).read_text())
    assert kept["ranks"] == ({task.key: 1} if faster_as_a_whole else {})
    assert ("built so, the model" in err) == faster_as_a_whole
    assert main(argv) == 0  # recalled: no builds to choose again
    err = capsys.readouterr().err
    assert "timing each task's" not in err
    assert ("as timed in the model by an earlier compile" in err) == faster_as_a_whole
    assert main([*argv, "--no-choose"]) == 0
    err = capsys.readouterr().err
    assert "timing each task's" not in err and "as timed in the model" not in err


def test_a_model_of_microseconds_is_not_chosen_for(tuned, tiny, tmp_path, capsys) -> None:
    """The debug executor's timer varies by more than such a model's records differ: the
    build with the fastest records is kept, and nothing is said or written."""
    work = _copy(tuned["meta_schedule"], tmp_path)
    text, params = tiny
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(tmp_path / "model.so")]  # fmt: skip
    assert main(argv) == 0
    assert "timing each task's" not in capsys.readouterr().err
    assert not (work / choose.CHOSEN_FILE).exists()


def test_a_compile_stopped_while_choosing_keeps_the_library_it_wrote(
    tuned, tiny, tmp_path, monkeypatch, capsys
) -> None:
    """Ctrl-C during the choice's builds: the library with the fastest records, written
    before them, is whole and runs; no choice is kept, and no partial file is left."""
    import tvm

    work = _copy(tuned["meta_schedule"], tmp_path)
    monkeypatch.setattr(choose, "MIN_SECONDS", 0.0)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(choose, "build", stopped)
    text, params = tiny
    library = tmp_path / "out" / "model.so"
    library.parent.mkdir()
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(library)]  # fmt: skip
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert f"stopped while choosing; {library} holds the build with the fastest records" in err
    assert [p.name for p in library.parent.iterdir()] == ["model.so"]
    assert tvm.runtime.load_module(str(library))["default"] is not None
    assert not (work / choose.CHOSEN_FILE).exists()


def test_a_rank_none_of_whose_records_computes_right_takes_the_best_that_does(
    tuned, tiny, monkeypatch
) -> None:
    """Where no record from a task's rank on computes what it computes, the build takes its
    best that does, as without a rank (the task built default instead failed to build: its
    weight's layout was the record's)."""
    work = tuned["meta_schedule"]
    mod, params = load_model(tiny[0], params=tiny[1])
    (task,) = building.plan(mod, params, work).tasks
    real = library.best_agreeing
    every = len(
        WorkDatabase(work, [task.native.dispatched[0]], keep=5).memory.get_all_tuning_records()
    )

    def none_past_the_fastest(name, candidates, *args):
        return real(name, candidates, *args) if len(candidates) == every else None

    monkeypatch.setattr(library, "best_agreeing", none_past_the_fastest)
    memory = WorkDatabase(work, [task.native.dispatched[0]], keep=5).memory
    target = building.plan(mod, params, work).target
    checked, kept = library._agreeing(memory, [task], target, {task.key: 1})
    (record,) = checked.get_all_tuning_records()
    fastest = min(s for _, s in raw_measurements(work, "meta_schedule") if s is not None)
    assert kept == [task]
    assert float(np.mean([float(s) for s in record.run_secs])) == pytest.approx(fastest)


def test_a_choice_whose_build_fails_keeps_the_fastest_records(
    tuned, tiny, tmp_path, monkeypatch, capsys
) -> None:
    work = _copy(tuned["meta_schedule"], tmp_path)
    monkeypatch.setattr(choose, "MIN_SECONDS", 0.0)

    def failed(*args, **kwargs):
        raise TuningError("building with the records failed: an assertion in TOPI")

    monkeypatch.setattr(choose, "build", failed)
    text, params = tiny
    library_path = tmp_path / "model.so"
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(library_path)]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "choosing stopped, that build failed (building with the records failed: an " in err
    assert library_path.exists()
    assert json.loads((work / choose.CHOSEN_FILE).read_text())["ranks"] == {}
    assert main(argv) == 0  # kept: not tried again while the records stand
    assert "choosing" not in capsys.readouterr().err
