"""One tune per work dir: a second tune or a compile is refused naming the holder, a dead
holder's lock is taken over, and a worker whose supervisor was killed stops by itself."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relay_tasks.cli import main
from relay_tasks.tuning.lock import LOCK_FILE, held

from tuned_models import raw_measurements, tune_argv, valid_count


def _copy(tuned: dict[str, Path], tuner: str, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    return work


def test_a_second_tune_and_a_compile_are_refused_naming_the_holder(tiny, tuned, tmp_path, capsys):
    work = _copy(tuned, "meta_schedule", tmp_path)
    text, params = tiny
    compile_argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
                    "-o", str(tmp_path / "m.tar")]  # fmt: skip
    with held(work, "tune", exclusive=True):
        assert main(tune_argv(tiny, "meta_schedule", work, 5)) == 7
        assert main(compile_argv) == 7
        refusal = (
            f"relay-tasks: error: {work} is in use by relay-tasks tune (pid {os.getpid()}); "
            "wait for it to end or stop it, or give another --work-dir"
        )
        assert capsys.readouterr().err.splitlines() == [refusal, refusal]
        assert main(["status", "--work-dir", str(work)]) == 0  # reading while it tunes is fine
    assert valid_count(work, "meta_schedule") == 3  # nothing was measured meanwhile
    assert main(compile_argv) == 0


def test_the_lock_of_a_dead_process_is_taken_over(tiny, tuned, tmp_path) -> None:
    work = _copy(tuned, "autotvm", tmp_path)
    (work / LOCK_FILE).write_text("relay-tasks tune (pid 999999999)\n")  # no lock held
    assert main(tune_argv(tiny, "autotvm", work, 3)) == 0


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
def test_a_killed_supervisors_worker_stops_and_the_dir_is_free_again(tuner, tiny, tmp_path):
    work = tmp_path / "work"
    command = [sys.executable, "-m", "relay_tasks.cli", *tune_argv(tiny, tuner, work, 500)]
    supervisor = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
    kept = valid_count(work, tuner)
    assert kept >= 1
    assert main(tune_argv(tiny, tuner, work, kept + 1)) == 0  # the lock went with them
    assert valid_count(work, tuner) == kept + 1


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
