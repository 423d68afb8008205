"""A work dir shared: tunes of several models at once, each with its own budget and records,
status showing which models each task serves; and a worker whose supervisor was killed stops
by itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relay

from relay_tasks import scratch
from relay_tasks.adapters.journal import LOCK_FILE
from relay_tasks.cli import main
from relay_tasks.errors import TuningError
from relay_tasks.tuning.tune import file_tasks

from tuned_models import (
    TUNERS,
    TUNERS_ONE_FAST,
    raw_measurements,
    tiny_weight,
    tune_argv,
    valid_count,
    write_other,
)


def _copy(tuned: dict[str, Path], tuner: str, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    return work


def _tune(model: tuple[Path, Path], work: Path, trials: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "relay_tasks.cli",
               *tune_argv(model, "meta_schedule", work, trials)]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _valid_line(out: str) -> str:
    return next(line for line in out.splitlines() if "valid measurements" in line)


def test_tunes_of_two_models_share_a_work_dir_at_once(tiny, tmp_path, capsys) -> None:
    """Both tunes run at once into one work dir: each reaches its budget with its own records,
    every record is read back under its own workload, a compile runs meanwhile, and status
    shows which model each task serves."""
    work, other = tmp_path / "work", write_other(tmp_path)
    tunes = [_tune(tiny, work, 6), _tune(other, work, 6)]
    while (work / "database_tuning_record.json").exists() is False and tunes[0].poll() is None:
        time.sleep(0.2)
    text, params = tiny
    # The records may not hold one of this model's yet (the other tune wrote first): --untuned.
    compiled = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
                "-o", str(tmp_path / "m.tar"), "--untuned"]  # fmt: skip
    assert main(compiled) == 0  # reading while both write
    for process in tunes:
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err.decode()
    capsys.readouterr()
    for model in (tiny, other):
        argv = ["status", str(model[0]), "--params", str(model[1]), "--work-dir", str(work)]
        assert main(argv) == 0
        valid = int(_valid_line(capsys.readouterr().out).split()[0])
        assert valid >= 6
    assert main(["status", "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()[:3]
    assert header.split()[-1] == "models"
    served = {row.split()[1]: row.split()[-1] for row in rows}  # the tunes' order varies
    assert served == {"fused_nn_dense_nn_relu": str(text), "fused_nn_dense": str(other[0])}
    counted = _valid_line(out).replace(",", "").split()
    total = int(counted[0]) + (int(counted[3]) if "failed" in counted else 0)
    lines = (work / "database_tuning_record.json").read_text().splitlines()
    assert total == len(lines) == len(raw_measurements(work, "meta_schedule"))
    assert len((work / "database_workload.json").read_text().splitlines()) == 2


@pytest.mark.parametrize("tuner", TUNERS_ONE_FAST)
def test_a_tune_stops_when_another_fills_its_budget(tuner, tiny, tuned, tmp_path) -> None:
    """Issue 52: two tunes of one model into one work dir each measured what was missing when
    it started. Here, while a tune of 80 runs, records "of another tune" bring the work dir to
    80 valid: the tune stops within the round under way (two at most, one sent just before)
    instead of measuring the 60-odd it had left."""
    from relay_tasks.adapters import get_adapter
    from relay_tasks.adapters.journal import append

    work = _copy(tuned, tuner, tmp_path)
    files = get_adapter(tuner).files
    valid = [line for line, (_, seconds) in zip((work / files.records).read_text().splitlines(),
             raw_measurements(work, tuner), strict=True) if seconds is not None]  # fmt: skip
    before = valid_count(work, tuner)
    command = [sys.executable, "-m", "relay_tasks.cli", *tune_argv(tiny, tuner, work, 80)]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while valid_count(work, tuner) == before and child.poll() is None:
        assert time.monotonic() < deadline, "the tune measured nothing"
        time.sleep(0.2)
    others = [valid[i % len(valid)] for i in range(80)]
    stamps = [(files.times, [json.dumps({"t": None})] * len(others))] if files.times else []
    append(work, [(files.records, others), *stamps])
    assert child.wait(timeout=240) == 0, child.stderr.read() if child.stderr else ""
    ours = valid_count(work, tuner) - before - len(others)
    assert 0 < ours <= 40, ours  # Ansor's rounds are 16, MetaSchedule's 8 then 32


def test_a_lock_file_that_is_a_link_is_not_followed(tiny, tuned, tmp_path, capsys) -> None:
    work, elsewhere = _copy(tuned, "ansor", tmp_path), tmp_path / "elsewhere"
    elsewhere.write_text("keep")
    (work / LOCK_FILE).unlink(missing_ok=True)
    (work / LOCK_FILE).symlink_to(elsewhere)
    assert main(tune_argv(tiny, "ansor", work, 3)) == 7
    assert "is a symbolic link; remove it" in capsys.readouterr().err
    assert elsewhere.read_text() == "keep"


def _descendants(pid: int) -> set[int]:
    """Every process whose parent chain reaches ``pid``, and every process of the sessions of
    its children (the worker's builders and runners)."""
    parents: dict[int, int] = {}
    sessions: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid_of = int(stat.parent.name)
        parents[pid_of], sessions[pid_of] = int(fields[1]), int(fields[4])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found | {p for p, sid in sessions.items() if sid in found}


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


@pytest.mark.parametrize("tuner", ["meta_schedule"])
def test_a_killed_supervisors_worker_stops_and_the_tune_resumes(tuner, tiny, tmp_path, monkeypatch):
    """``kill -9`` of ``relay-tasks tune``: its worker stops, and the next tune resumes and
    removes the scratch folder (with what TVM's builders left in it) the killed one could not."""
    work, temporary = tmp_path / "work", tmp_path / "tmp"
    temporary.mkdir()
    command = [sys.executable, "-m", "relay_tasks.cli", *tune_argv(tiny, tuner, work, 500)]
    supervisor = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env={**os.environ, "TMPDIR": str(temporary)})  # fmt: skip
    deadline = time.monotonic() + 240
    while not raw_measurements_or_none(work, tuner):
        assert supervisor.poll() is None and time.monotonic() < deadline
        time.sleep(0.5)
    tuning = _descendants(supervisor.pid)
    assert tuning, "the worker runs in a child process"
    supervisor.kill()
    supervisor.wait()
    deadline = time.monotonic() + 15
    while _alive(tuning) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(tuning) == set()
    (left,) = temporary.glob(f"relay-tasks-worker-{supervisor.pid}-*")
    kept = valid_count(work, tuner)
    assert kept >= 1
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    monkeypatch.setattr(scratch, "STALE_SECONDS", 0.0)  # as if it were an hour later
    assert main(tune_argv(tiny, tuner, work, kept + 1)) == 0
    assert valid_count(work, tuner) == kept + 1
    assert not left.exists() and list(temporary.iterdir()) == []


def raw_measurements_or_none(work: Path, tuner: str) -> list:
    try:
        return [r for r in raw_measurements(work, tuner) if r[1] is not None]
    except (FileNotFoundError, ValueError, IndexError):
        return []


def test_stopping_the_worker_group_is_what_the_watch_does(monkeypatch) -> None:
    """The watch thread ends the worker's process group once its parent changes."""
    from relay_tasks.tuning import worker

    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(worker, "PARENT_POLL", 0.01)
    monkeypatch.setattr(os, "killpg", lambda group, number: killed.append((group, number)))
    worker.watch_parent(os.getppid() + 1)  # not our parent: the watch fires at once
    deadline = time.monotonic() + 5
    while not killed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert killed == [(os.getpgrp(), signal.SIGKILL)]


@pytest.mark.parametrize("tuner", TUNERS)
def test_reuse_copies_the_records_of_equal_tasks_once_and_tunes_nothing_again(
    tuner, tiny, tuned, tmp_path, capsys
) -> None:
    work = tmp_path / "work"
    argv = [*tune_argv(tiny, tuner, work, 3), "--reuse", str(tuned[tuner])]
    for copied in (3, 0):  # the second time copies nothing more
        assert main(argv) == 0
        assert valid_count(work, tuner) == valid_count(tuned[tuner], tuner) == 3
        said = re.search(r"reusing the records of (\d+) of (\d+) tasks \((\d+) copied\)",
                         capsys.readouterr().err)  # fmt: skip
        assert said and said[1] == said[2] and int(said[3]) == copied  # every task reused
    assert not (work / "tune.log").exists()  # no tuner ran
    source = [s for _, s in raw_measurements(tuned[tuner], tuner) if s is not None]
    assert sorted(s for _, s in raw_measurements(work, tuner) if s is not None) == sorted(source)


def test_reuse_tunes_only_the_tasks_no_other_work_dir_has(tiny, tuned, tmp_path, capsys) -> None:
    """A model with the tiny model's task and another: only the other one is measured."""
    data = relay.var("data", shape=(1, 32))
    w, v = relay.var("w", shape=(16, 32)), relay.var("v", shape=(8, 32))
    body = relay.Tuple([relay.nn.relu(relay.nn.dense(data, w)), relay.nn.dense(data, v)])
    text, params = tmp_path / "both.relay", tmp_path / "both.params"
    text.write_text(tvm.IRModule.from_expr(relay.Function([data, w, v], body)).astext())
    weights = {"w": tvm.nd.array(tiny_weight()), "v": tvm.nd.array(np.ones((8, 32), "float32"))}
    params.write_bytes(relay.save_param_dict(weights))
    work = tmp_path / "work"
    argv = [
        *tune_argv((text, params), "meta_schedule", work, 2),
        "--reuse",
        str(tuned["meta_schedule"]),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:3]}
    assert rows["fused_nn_dense_nn_relu"][5] == "3"  # reused: its 3 valid records, no new one
    assert int(rows["fused_nn_dense"][5]) >= 2  # the budget went to the other task


@pytest.mark.parametrize(
    ("source", "problem"),
    [("missing", "is not a relay-tasks work dir"), ("ansor", "holds ansor records for")],
)
def test_reuse_of_what_is_no_work_dir_of_this_tuning_is_refused(
    source, problem, tiny, tuned, tmp_path, capsys
) -> None:
    reuse = str(tuned.get(source, tmp_path / source))
    assert main([*tune_argv(tiny, "meta_schedule", tmp_path / "w", 3), "--reuse", reuse]) == 2
    err = capsys.readouterr().err
    assert problem in err and len(err.splitlines()) == 1


def test_a_tune_of_models_including_an_earlier_ones_replaces_its_task_file(tmp_path) -> None:
    """The work dir's tasks count each model once: tuning [a, b] after [a] and [b] leaves one
    task file, a later [c] a second."""
    for models in (["a"], ["b"], ["a", "b"], ["c"]):
        file_tasks(tmp_path, {"models": models})
    kept = sorted(json.loads(p.read_text())["models"] for p in (tmp_path / "tunes").iterdir())
    assert kept == [["a", "b"], ["c"]]
    assert json.loads((tmp_path / "tasks.json").read_text())["models"] == ["c"]


def test_a_tunes_folder_that_is_a_link_is_not_followed(tmp_path) -> None:
    elsewhere, work = tmp_path / "elsewhere", tmp_path / "work"
    elsewhere.mkdir()
    work.mkdir()
    (work / "tunes").symlink_to(elsewhere)
    with pytest.raises(TuningError, match="tunes is not a directory; remove it"):
        file_tasks(work, {"models": ["a"]})
    assert list(elsewhere.iterdir()) == []


def test_a_metaschedule_tune_of_another_model_learns_the_work_dirs_records_first(
    tuned, tmp_path, monkeypatch
) -> None:
    """A work dir holding the tiny model's records, tuned for another model: the cost model
    learns those records (their tasks derived again from the work dir's task files) before
    the search, so a warm-up they fill draws nothing at random."""
    from relay_tasks import host_target
    from relay_tasks.adapters import get_adapter
    from relay_tasks.adapters.base import Runner
    from relay_tasks.adapters.meta_schedule import session
    from relay_tasks.loaders import load_model
    from relay_tasks.tuning.worker import other_tunes, tune_until

    from tuned_models import write_tiny

    work = _copy(tuned, "meta_schedule", tmp_path)
    text, weights = write_tiny(tmp_path, batch=2)
    mod, params = load_model(text, params=weights)
    adapter, target = get_adapter("meta_schedule"), host_target()
    tasks = adapter.extract(mod, target, params)
    teachers = other_tunes(work, tasks)
    tiny = [m.key for m in adapter.measurements(work)]
    assert teachers and {t.task.key for t in teachers} == set(tiny)
    assert {t.work_dir for t in teachers} == {work}
    assert not {t.key for t in tasks} & set(tiny)
    learnt: list[int] = []
    drawn: list[int] = []
    learn = session._Session.learn
    monkeypatch.setattr(session._Session, "learn",
                        lambda self, others: learnt.append(learn(self, others)) or learnt[-1])  # fmt: skip
    monkeypatch.setattr(session, "_replay", lambda n: drawn.append(n))
    before = valid_count(work, "meta_schedule")
    monkeypatch.setattr(session, "WARMUP", before)
    tune_until(adapter, tasks, target, 2, work, Runner(), teachers=lambda: teachers)
    assert learnt == [before] and drawn == []


def _at_batch(tuned: dict[str, Path], tuner: str, tmp_path: Path, batch: int) -> tuple[Any, ...]:
    """A copy of ``tuner``'s tuned work dir, its task, the tiny model's task at ``batch`` and the
    host target."""
    from relay_tasks import host_target
    from relay_tasks.adapters import get_adapter
    from relay_tasks.loaders import load_model
    from relay_tasks.tuning.tune import tasks_in

    from tuned_models import write_tiny

    source = _copy(tuned, tuner, tmp_path)
    text, weights = write_tiny(tmp_path, batch=batch)
    mod, params = load_model(text, params=weights)
    target = host_target()
    [task] = get_adapter(tuner).extract(mod, target, params)
    [tutor] = tasks_in(source).tasks
    return source, tutor, task, target


def test_a_metaschedule_task_without_records_starts_from_a_similar_tasks_best_schedule(
    tuned, tmp_path, capsys
) -> None:
    """The tiny model at batch 2 tuned with ``reuse`` naming the batch-1 work dir: its dense is
    another task (another shape) of the same operators, so its first measurement is the
    batch-1 task's best schedule, replayed on it (tile sizes redrawn where 2 rows no longer
    divide as 1 did), not a random one; the tune says so first."""
    from relay_tasks import tune
    from relay_tasks.adapters.meta_schedule.database import WorkDatabase

    source, tutor, task, target = _at_batch(tuned, "meta_schedule", tmp_path, 2)
    assert tutor.key != task.key and tutor.name == task.name
    memory = WorkDatabase(source, [tutor.native.dispatched[0]]).memory
    [best] = memory.get_top_k(memory.commit_workload(tutor.native.dispatched[0]), 1)
    replayed = tvm.tir.Schedule(task.native.dispatched[0])
    best.trace.apply_to_schedule(replayed, remove_postproc=True)

    work = tmp_path / "batch2"
    tune([task], target, tuner="meta_schedule", trials=1, work_dir=work, reuse=[source])
    first = json.loads((work / "database_tuning_record.json").read_text().splitlines()[0])
    assert first[1][0][1] == json.loads(json.dumps(replayed.trace.as_json()[1], default=int))
    assert ("relay-tasks: 1 of 1 task to tune starts from the best schedules of similar tasks "
            "tuned there") in capsys.readouterr().err  # fmt: skip


def test_autotvm_tasks_without_records_start_from_similar_tasks_best_configs(
    tuned, tmp_path, capsys
) -> None:
    """The tiny model at batch 8 tuned with ``reuse`` naming the batch-1 work dir: each of its
    templates' first measurements are the configs the batch-1 task of that template measured
    fastest, on the new shapes (their split factors all divide 8 rows as they divided 1), and
    they run; the tune says how many tasks start so. A record planted there claiming the
    fastest time with a split no search draws (a factor of a million) starts nothing: every
    config measured is a point of its task's own space."""
    from relay_tasks import host_target, tune
    from relay_tasks.adapters import get_adapter
    from relay_tasks.adapters.autotvm import check_configs
    from relay_tasks.loaders import load_model

    from tuned_models import write_tiny

    source = _copy(tuned, "autotvm", tmp_path)
    text, weights = write_tiny(tmp_path, batch=8)
    mod, params = load_model(text, params=weights)
    tasks = get_adapter("autotvm").extract(mod, host_target(), params)
    taught = [json.loads(line) for line in (source / "autotvm.log").read_text().splitlines()]
    fastest: dict[str, list[Any]] = {}
    for r in sorted((r for r in taught if r["result"][1] == 0), key=lambda r: sum(r["result"][0])):
        fastest.setdefault(r["input"][1], []).append(r["config"]["entity"])
    assert fastest
    planted = json.loads(json.dumps(taught[0]))
    planted["config"]["entity"][-1][2] = [-1, 1_000_000]
    planted["result"] = [[1e-12], 0, 0.0, planted["result"][3]]
    with (source / "autotvm.log").open("a") as log:
        log.write(json.dumps(planted) + "\n")

    work = tmp_path / "batch8"
    tune(tasks, host_target(), tuner="autotvm", trials=12, work_dir=work, reuse=[source])
    records = [json.loads(line) for line in (work / "autotvm.log").read_text().splitlines()]
    assert all(r["input"][2][0][1] == [8, 32] for r in records)
    check_configs([t.native for t in tasks], work)  # raises for one outside
    started = 0
    for template, best in fastest.items():
        mine = [r for r in records if r["input"][1] == template]
        first = min(2, len(best), len(mine))
        assert [r["config"]["entity"] for r in mine[:first]] == best[:first]
        assert all(r["result"][1] == 0 for r in mine[:first])  # they run on the new shapes
        started += first > 0
    assert started
    said = (f"relay-tasks: {len(fastest)} of {len(tasks)} tasks to tune start from the best "
            "schedules of similar tasks tuned there")  # fmt: skip
    assert said in capsys.readouterr().err


def test_autotvm_tunes_a_model_beside_another_shape_of_its_templates(tuned, tmp_path) -> None:
    """The tiny model at batch 8 tuned into the batch-1 work dir: each task learns only its
    own records (AutoTVM's cost model fails on another shape's, whose loop nests give it
    another number of features) and starts from the batch-1 tasks' best configs."""
    from relay_tasks import host_target, tune
    from relay_tasks.adapters import get_adapter
    from relay_tasks.loaders import load_model

    from tuned_models import write_tiny

    work = _copy(tuned, "autotvm", tmp_path)
    text, weights = write_tiny(tmp_path, batch=8)
    mod, params = load_model(text, params=weights)
    tasks = get_adapter("autotvm").extract(mod, host_target(), params)
    standing = tune(tasks, host_target(), tuner="autotvm", trials=6, work_dir=work)
    assert standing.valid == 6


def test_an_ansor_task_without_records_starts_from_a_similar_tasks_best_states(
    tuned, tmp_path, capsys
) -> None:
    """The tiny model at batch 8 tuned with ``reuse`` naming the batch-1 work dir: its compute
    is the batch-1 task's at other extents, so its first measurements are the batch-1 task's
    two fastest states, measured on it; the tune says so first, and not when it resumes (the
    task goes on from its own records then)."""
    from relay_tasks import tune

    source, tutor, task, target = _at_batch(tuned, "ansor", tmp_path, 8)
    assert tutor.key != task.key
    taught = [json.loads(line) for line in (source / "ansor.json").read_text().splitlines()]
    fastest = sorted((r for r in taught if r["r"][1] == 0), key=lambda r: sum(r["r"][0]))[:2]

    work = tmp_path / "batch8"
    tune([task], target, tuner="ansor", trials=4, work_dir=work, reuse=[source])
    records = [json.loads(line) for line in (work / "ansor.json").read_text().splitlines()]
    steps = [r["i"][1][1] for r in records]
    assert steps[:2] == [r["i"][1][1] for r in fastest]
    assert all(r["i"][0][0] == task.native.workload_key for r in records)
    assert all(r["r"][1] == 0 for r in records[:2])  # they run on the new extents
    said = ("relay-tasks: 1 of 1 task to tune starts from the best schedules of similar tasks "
            "tuned there")  # fmt: skip
    assert said in capsys.readouterr().err
    tune([task], target, tuner="ansor", trials=len(records) + 1, work_dir=work, reuse=[source])
    assert "similar" not in capsys.readouterr().err  # resumed: it goes on from its own records
