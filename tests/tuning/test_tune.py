"""Tuning measures for real, spends the budget, resumes, reports failures, and stops on signals."""

from __future__ import annotations

import importlib
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import relay_tasks
from relay_tasks.cli import main

from tuned_models import (
    TUNERS,
    TUNERS_ONE_FAST,
    raw_measurements,
    tune_argv,
    valid_count,
    valid_count_or_zero,
)
from zoo import load


@pytest.mark.parametrize("tuner", TUNERS)
def test_every_tuner_measures_the_budget_validly(tuner: str, tuned: dict[str, Path]) -> None:
    work = tuned[tuner]
    assert valid_count(work, tuner) == 3  # exactly the budget, each with a finite latency
    assert {p.name for p in work.iterdir()} >= {"tasks.json", "tune.log"}


@pytest.mark.parametrize("tuner", TUNERS)
def test_a_rerun_spends_only_what_is_missing(
    tuner: str, tiny, tuned: dict[str, Path], tmp_path: Path, capsys, monkeypatch
) -> None:
    """...says what it resumes, and shows progress off a terminal (every 30 s; 0.5 s here)."""
    monkeypatch.setattr(importlib.import_module("relay_tasks.tuning.tune"), "QUIET_INTERVAL", 0.5)
    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    before = raw_measurements(work, tuner)
    assert main(tune_argv(tiny, tuner, work, 3)) == 0
    assert raw_measurements(work, tuner) == before  # all there: nothing measured again
    capsys.readouterr()
    assert main(tune_argv(tiny, tuner, work, 5)) == 0
    assert valid_count(work, tuner) == 5
    err = capsys.readouterr().err.splitlines()
    resumed = rf"relay-tasks: resuming: [12] of {len(out_rows(work))} tasks already have valid records in "
    assert re.match(resumed + re.escape(f"{work} (3 valid measurements)"), err[0]), err[0]
    assert all(re.match(r"relay-tasks: tuning task \d/\d \| ", line) for line in err[1:])
    assert main(tune_argv(tiny, tuner, work, 5)) == 0  # the summary, once more, on stdout
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["#", "task", "weight"]
    summary = [line for line in out if re.match(r"5 valid measurements(, \d+ failed)?; ", line)]
    assert summary and "; estimated model latency " in summary[0]
    assert all(line.startswith("failed #") for line in out[out.index(summary[0]) + 1 :])


def test_failed_records_do_not_count_as_done(tiny, tuned: dict[str, Path], tmp_path) -> None:
    """A resume retries what failed: here every record of the log is turned into a failure."""
    work = tmp_path / "work"
    shutil.copytree(tuned["autotvm"], work)
    log = work / "autotvm.log"
    failed = []
    for line in log.read_text().splitlines():
        record = json.loads(line)
        record["result"][:2] = [[1e9], 4]  # RUNTIME_DEVICE
        failed.append(json.dumps(record))
    log.write_text("\n".join(failed) + "\n")
    assert valid_count(work, "autotvm") == 0
    assert main(tune_argv(tiny, "autotvm", work, 3)) == 0
    rows = raw_measurements(work, "autotvm")
    assert len(rows) == 6 and valid_count(work, "autotvm") == 3


def test_a_tune_where_every_measurement_fails_says_why(tiny, tmp_path, capsys) -> None:
    argv = tune_argv(tiny, "meta_schedule", tmp_path / "w", 2)
    code = main([*argv, "--timeout", "0.0001"])  # no run ends in time
    err = capsys.readouterr().err
    assert code == relay_tasks.TuningError.exit_code
    assert len(err.splitlines()) == 1
    assert re.match(r"relay-tasks: error: all \d+ measurements failed; the first: \S", err)
    assert "tune.log" in err


def test_cuda_without_a_gpu_or_tracker_is_refused_before_tuning(tiny, tmp_path, capsys) -> None:
    code = main([*tune_argv(tiny, "meta_schedule", tmp_path / "w", 2), "--target", "cuda"])
    assert code == relay_tasks.TargetError.exit_code
    assert "no cuda device to measure on" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def _worker_processes(work: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.parametrize(
    ("tuner", "signum"),
    [
        ("meta_schedule", signal.SIGINT),
        ("autotvm", signal.SIGTERM),
        ("ansor", signal.SIGHUP),  # the terminal closed
    ],
)
def test_a_signal_stops_tuning_keeps_the_records_and_the_tune_resumes(
    tuner: str, signum: int, tiny, tmp_path: Path
) -> None:
    work, temporary = tmp_path / "work", tmp_path / "tmp"
    temporary.mkdir()
    command = [sys.executable, "-m", "relay_tasks.cli", *tune_argv(tiny, tuner, work, 500)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(temporary)})  # fmt: skip
    deadline = time.monotonic() + 240
    while valid_count_or_zero(work, tuner) == 0:
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.5)
    child.send_signal(signum)
    sent = time.monotonic()
    out, err = child.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert child.returncode == 128 + signum
    # Off a terminal a progress line comes every 30 s: a slow host shows one before the signal.
    lines = [line for line in err.splitlines() if not line.startswith("relay-tasks: tuning task")]
    assert (
        out == "" and len(lines) == 1 and lines[0].startswith("relay-tasks: interrupted: stopped; ")
    )
    assert _worker_processes(work) == []
    # What the builders had made for candidates never run went with the tune's scratch folder.
    assert list(temporary.iterdir()) == []
    kept = valid_count(work, tuner)
    assert kept >= 1 and f"{kept} valid measurements are kept" in err
    assert main(tune_argv(tiny, tuner, work, kept + 2)) == 0  # the same work dir resumes
    assert valid_count(work, tuner) == kept + 2


def test_a_killed_tuner_process_is_named_with_what_was_kept(tiny, tmp_path: Path) -> None:
    """``kill -9`` of the worker (or the OOM killer): the line names the process and the signal,
    not TVM's last log line, and says what is kept and that running again resumes."""
    work = tmp_path / "work"
    command = [
        sys.executable,
        "-m",
        "relay_tasks.cli",
        *tune_argv(tiny, "meta_schedule", work, 500),
    ]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while valid_count_or_zero(work, "meta_schedule") == 0:
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.5)
    found = subprocess.run(["pgrep", "-P", str(child.pid), "-f", "relay_tasks.tuning.worker"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    (worker,) = found.stdout.split()
    os.kill(int(worker), signal.SIGKILL)
    _, err = child.communicate(timeout=60)
    assert child.returncode == relay_tasks.TuningError.exit_code
    lines = [line for line in err.splitlines() if not line.startswith("relay-tasks: tuning task")]
    kept = valid_count(work, "meta_schedule")
    assert lines == [
        f"relay-tasks: error: the tuner's process (pid {worker}) was killed by SIGKILL; {kept} "
        f"valid measurements are kept in {work}: run the same command again to resume"
    ]
    assert _worker_processes(work) == []


@pytest.mark.parametrize("tuner", TUNERS_ONE_FAST)
def test_a_killed_builder_or_runner_child_fails_its_candidate_not_the_tune(
    tuner: str, tiny, tmp_path: Path
) -> None:
    """``kill -9`` of the processes that build and run candidates (TVM's pool workers, the
    tuner process's children), three in all, the first as soon as one shows (MetaSchedule's
    builder checks its child as it starts), each next once a measurement was kept since: the
    candidate a killed child held fails, its pool starts another child, and the tune reaches
    its trials."""
    work = tmp_path / "work"
    command = [sys.executable, "-m", "relay_tasks.cli", *tune_argv(tiny, tuner, work, 12)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: list[str] = []
    kept, deadline = 0, time.monotonic() + 240
    while len(killed) < 3 and child.poll() is None and time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-f", "tvm.exec.popen_worker"],
                               capture_output=True, text=True)  # fmt: skip
        ours = [pid for pid in found.stdout.split() if _descends(int(pid), child.pid)]
        if ours and (not killed or valid_count_or_zero(work, tuner) > kept):
            os.kill(int(ours[0]), signal.SIGKILL)
            killed.append(ours[0])
            kept = valid_count_or_zero(work, tuner)
        time.sleep(0.05)
    _, err = child.communicate(timeout=300)
    assert len(killed) == 3, f"the tune ended before three of its children were killed: {err}"
    assert child.returncode == 0, err
    assert valid_count(work, tuner) >= 12
    assert all(s is None or 0 < s < 1 for _, s in raw_measurements(work, tuner))


def _descends(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or below it."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


@pytest.mark.parametrize("tuner", TUNERS_ONE_FAST)
def test_a_time_budget_stops_the_tune_and_keeps_what_was_measured(
    tuner: str, tiny, tmp_path: Path
) -> None:
    """``--time`` alone: the tune ends at the budget (exit 0), every record kept is a valid
    measurement or a failure with its cause, and the same command measures more."""
    work = tmp_path / "work"
    argv = [a for a in tune_argv(tiny, tuner, work, 1) if a not in ("--trials", "1")]
    command = [sys.executable, "-m", "relay_tasks.cli", *argv, "--time", "12s"]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "relay-tasks: the time budget (12s) is spent; " in done.stderr
    assert 12 < took < 12 + 60  # the start (extraction, TVM's import) is not in the budget
    first = valid_count(work, tuner)
    assert first >= 1 and all(s is None or 0 < s < 1 for _, s in raw_measurements(work, tuner))
    assert f"; {first} new valid measurements ({first / 12 * 60:.1f} a minute)" in done.stderr
    # With --trials as well, whichever comes first: here the trials.
    assert main([*argv, "--time", "1h", "--trials", str(first + 2)]) == 0
    assert valid_count(work, tuner) >= first + 2


def out_rows(work: Path) -> list:
    """The tasks of the work dir's last tune."""
    return json.loads((work / "tasks.json").read_text())["tasks"]


def test_progress_shows_on_a_terminal_only_and_stdout_keeps_the_result(tiny, tmp_path) -> None:
    command = [sys.executable, "-m", "relay_tasks.cli"]
    main_fd, terminal = pty.openpty()
    argv = tune_argv(tiny, "meta_schedule", tmp_path / "tty", 6)
    with subprocess.Popen([*command, *argv], stdout=subprocess.PIPE, stderr=terminal) as child:
        os.close(terminal)
        shown = b""
        while True:
            try:
                chunk = os.read(main_fd, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            shown += chunk
        out = child.stdout.read().decode() if child.stdout else ""
    os.close(main_fd)
    assert b"tuning task 1/1 | " in shown and b"/6 measured" in shown
    assert any(line.startswith("6 valid measurements") for line in out.splitlines())
    assert "tuning task" not in out
    piped = subprocess.run([*command, *tune_argv(tiny, "meta_schedule", tmp_path / "pipe", 2)],
                           capture_output=True, text=True, check=True)  # fmt: skip
    # Off a terminal: a progress line of its own every 30 s at most, none in a short tune.
    assert all(
        line.startswith("relay-tasks: tuning task 1/1 | ") for line in piped.stderr.splitlines()
    )
    assert any(line.startswith("2 valid measurements") for line in piped.stdout.splitlines())


def test_tuning_writes_only_into_the_work_dir(tmp_path: Path, monkeypatch) -> None:
    cwd, work = tmp_path / "cwd", tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    mod, params = load("dense_softmax")
    target = relay_tasks.host_target()
    tasks = relay_tasks.extract(mod, target, params, tuner="ansor")[:1]
    now = relay_tasks.tune(tasks, target, tuner="ansor", trials=2, work_dir=work)
    assert now.valid == 2 == valid_count(work, "ansor")
    assert {p.name for p in work.iterdir()} >= {"ansor.json", "total_latency.tsv", "tune.log"}
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("tuner", TUNERS)
def test_tune_through_an_rpc_tracker(tuner: str, tmp_path: Path) -> None:
    from relay_tasks.rpc import start_server, start_tracker

    tracker = start_tracker()
    server = start_server(("127.0.0.1", tracker.port), "relay-tasks-test", port=9300)
    try:
        mod, params = load("dense_softmax")
        target = relay_tasks.host_target()
        tasks = relay_tasks.extract(mod, target, params, tuner=tuner)[:1]
        now = relay_tasks.tune(tasks, target, tuner=tuner, trials=2, work_dir=tmp_path,
                               rpc_tracker=f"127.0.0.1:{tracker.port}",
                               rpc_key="relay-tasks-test")  # fmt: skip
        assert now.valid == 2 == valid_count(tmp_path, tuner)
    finally:
        server.terminate()
        tracker.terminate()


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_serve_stops_its_server_on_sigterm() -> None:
    from relay_tasks.rpc import start_tracker

    tracker = start_tracker()
    try:
        command = [sys.executable, "-m", "relay_tasks.cli", "serve", "--tracker",
                   f"127.0.0.1:{tracker.port}", "--key", "relay-tasks-serve", "--port", "9400"]  # fmt: skip
        serve = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        assert serve.stderr is not None
        assert "serving as 'relay-tasks-serve' at 127.0.0.1:" in serve.stderr.readline()
        children = _children(serve.pid)
        assert children, "the server runs in a child process"
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=20) == 128 + signal.SIGTERM
        # An ended child lingers until it is reaped: give a loaded machine a few seconds.
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{c}").exists() for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [c for c in children if Path(f"/proc/{c}").exists()] == []
    finally:
        tracker.terminate()


def test_the_timeout_bounds_builds_as_it_bounds_runs() -> None:
    from relay_tasks.adapters.ansor.runner import timeout_seconds
    from relay_tasks.adapters.autotvm.runner import builder_of
    from relay_tasks.adapters.base import Runner

    assert builder_of(Runner(timeout=3.5)).timeout == 3.5
    assert timeout_seconds(Runner(timeout=0.2)) == 1 and timeout_seconds(Runner(timeout=7.5)) == 8


def test_a_tune_with_its_budget_spent_measures_the_defaults_an_older_version_left(
    tuned, tiny, tmp_path
) -> None:
    """Compile says ``relay-tasks tune`` measures stale defaults again: so it does, even when
    the work dir already holds the measurements asked for (and measures nothing more)."""
    import json

    from relay_tasks.tuning.defaults import DEFAULTS_FILE, read_defaults, stale_defaults

    work = tmp_path / "work"
    shutil.copytree(tuned["autotvm"], work)
    keys = set(read_defaults(work))
    lines = [json.dumps({"task": key, "seconds": 1e-9, "version": 2}) + "\n" for key in keys]
    (work / DEFAULTS_FILE).write_text("".join(lines))
    before = valid_count(work, "autotvm")
    assert keys and stale_defaults(work) == keys
    assert main(tune_argv(tiny, "autotvm", work, before)) == 0
    assert stale_defaults(work) == set() and set(read_defaults(work)) == keys
    assert all(seconds > 1e-9 for seconds in read_defaults(work).values())
    assert valid_count(work, "autotvm") == before


def test_progress_says_what_is_true() -> None:
    """The count never shows more than the budget (a batch past it is named), the time left is
    the pace so far carried on, and the defaults' phase is named instead of ``0/N measured``."""
    from relay_tasks.adapters.base import Measurement, TunerTask
    from relay_tasks.tuning.tune import progress_line

    tasks = [
        TunerTask("conv", 1, "nn.conv2d", "a", None),
        TunerTask("dense", 1, "nn.dense", "b", None),
    ]
    done = (
        [Measurement("a", 1e-3)] * 10
        + [Measurement("b", None, "RUN_TIMEOUT")]
        + [Measurement("b", 2e-3)] * 14
    )
    line = progress_line(tasks, done, 20, since=4, elapsed=200.0)
    assert line.startswith(
        "tuning task 2/2 | 20/20 measured +4 in the tuner's last batch (1 failed)"
    )
    assert line.endswith("| 3m20s elapsed")  # nothing left: no estimate
    halfway = progress_line(tasks, done[:9], 40, since=4, elapsed=50.0)  # 5 in 50 s, 31 to go
    assert "9/40 measured" in halfway and halfway.endswith("50s elapsed, ~5m10s left")
    first = progress_line(tasks, [], 20, elapsed=15.0, defaults_missing=1)
    assert first == "measuring the default schedules: 1/2 tasks | 15s elapsed"
    assert progress_line(tasks, done[:3], 20, defaults_missing=1).startswith("tuning task 1/2")
    # The estimate takes the default schedules of tasks not measured yet.
    early = progress_line(tasks, done[:3], 20, defaults={"a": 2e-3, "b": 3e-3})
    assert early == "tuning task 1/2 | 3/20 measured | model ~4 ms"
    # A time budget: no count of a budget, and the time left is the budget's rest if sooner.
    timed = progress_line(tasks, done[:9], None, since=4, elapsed=50.0, time_budget=80.0)
    assert "| 9 measured |" in timed and timed.endswith("50s elapsed, ~30s left")
    both = progress_line(tasks, done[:9], 40, since=4, elapsed=50.0, time_budget=3600.0)
    assert both.endswith("~5m10s left")
