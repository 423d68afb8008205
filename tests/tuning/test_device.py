"""Code for a CPU this machine is not is refused in one line before anything is built or run."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import tvm

import relay_tasks
from relay_tasks.cli import main
from relay_tasks.host import check_runs_here, missing_features
from relay_tasks.inputs import as_target
from relay_tasks.tuning import device

from tuned_models import TUNERS_ONE_FAST, tune_argv
from zoo import HOST

#: Targets each selecting an instruction set that some x86 CPUs lack: AMX is Intel's (Sapphire
#: Rapids on), XOP was AMD's (Bulldozer to Excavator); no CPU has both, so one is foreign here.
FOREIGN = [
    f"llvm -mtriple=x86_64-linux-gnu -mcpu=x86-64 -mattr=+{feature}"
    for feature in ("amx-tile", "xop", "avx512f")
]


def _foreign_target() -> str:
    found = [t for t in FOREIGN if missing_features(tvm.target.Target(t))]
    assert found, "every one of the FOREIGN targets runs here: no CPU has them all"
    return found[0]


def _suggested(message: str) -> str:
    """The target a message tells the user to give (its last ``--target '...'``)."""
    return re.findall(r"--target '([^']+)'", message)[-1]


def test_a_cpu_feature_this_host_lacks_is_named_before_tuning(tiny, tmp_path: Path, capsys):
    target = _foreign_target()
    work = tmp_path / "w"
    assert main([*tune_argv(tiny, "meta_schedule", work, 2), "--target", target]) == 4
    err = capsys.readouterr().err
    lacks = ", ".join(missing_features(tvm.target.Target(target)))
    assert err.startswith(f"relay-tasks: error: this machine's CPU lacks {lacks}, which code ")
    assert "would die of an illegal instruction" in err and len(err.splitlines()) == 1
    assert not work.exists()  # refused before the work dir is made
    # The way out it names is a target this machine runs.
    check_runs_here(as_target(_suggested(err)), doing="measure")


def test_code_for_another_architecture_is_refused_before_tuning(tiny, tmp_path, capsys) -> None:
    work = tmp_path / "w"
    argv = [*tune_argv(tiny, "autotvm", work, 2), "--target", "llvm -mtriple=aarch64-linux-gnu"]
    assert main(argv) == 4
    err = capsys.readouterr().err
    assert "builds aarch64 code, which this x86_64 machine cannot measure" in err
    assert len(err.splitlines()) == 1 and not work.exists()


def test_compile_benchmark_is_refused_for_a_foreign_cpu(tiny, tmp_path, capsys) -> None:
    """The work dir's tasks are for a CPU with features this one lacks: the library may be
    built (for that device), but not run here."""
    text, params = tiny
    work, library = tmp_path / "w", tmp_path / "m.tar"
    work.mkdir()
    extracted = ["extract", str(text), "--params", str(params), "--target", _foreign_target(),
                 "--format", "json", "-o", str(work / "tasks.json")]  # fmt: skip
    assert main(extracted) == 0
    argv = [
        "compile",
        str(text),
        "--params",
        str(params),
        "--work-dir",
        str(work),
        "-o",
        str(library),
        "--untuned",
    ]  # fmt: skip (no records: built on purpose)
    assert main([*argv, "--benchmark"]) == 4
    assert "this machine's CPU lacks" in capsys.readouterr().err
    assert not library.exists()
    assert main(argv) == 0 and library.stat().st_size > 0  # building for it is fine


@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=x86-64 -opt-level=3"])
def test_a_target_without_triple_is_refused_with_one_that_works(tiny, target, capsys) -> None:
    """hhb-tvm's bare ``llvm`` means riscv64; the CLI says so and names the target to use."""
    text, params = tiny
    argv = ["extract", str(text), "--params", str(params)]
    code = main([*argv, "--target", target])
    err = capsys.readouterr().err
    assert code == 4 and len(err.splitlines()) == 1, err
    if "-mcpu" in target:  # LLVM's riscv64 knows no x86-64 CPU: that refusal comes first
        assert "is not a CPU LLVM knows for the default triple (riscv64" in err
        return
    assert "names no -mtriple, and hhb-tvm's LLVM then builds riscv64 code" in err
    assert _suggested(err) == HOST
    assert main([*argv, "--target", _suggested(err)]) == 0


def test_the_examples_in_target_errors_are_accepted(tiny, capsys) -> None:
    text, params = tiny
    assert main(["extract", str(text), "--params", str(params), "--target", "lvm"]) == 4
    err = capsys.readouterr().err
    examples = re.findall(r"e\.g\. '([^']+)' or '([^']+)'", err)
    assert examples, err
    for example in examples[0]:
        assert main(["extract", str(text), "--params", str(params), "--target", example]) == 0


def test_no_tracker_is_one_line_within_seconds(tiny, tmp_path, capsys, monkeypatch) -> None:
    import socket

    monkeypatch.setattr(device, "TRACKER_TIMEOUT", 1.0)
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    argv = [*tune_argv(tiny, "autotvm", tmp_path / "w", 2), "--rpc-tracker", f"127.0.0.1:{port}",
            "--rpc-key", "k"]  # fmt: skip
    started = time.monotonic()
    assert main(argv) == 7
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert err == (f"relay-tasks: error: no RPC tracker answers at 127.0.0.1:{port} (Connection "
                   "refused); start one (python -m tvm.exec.rpc_tracker) or fix --rpc-tracker\n")  # fmt: skip


def test_a_key_without_a_device_is_one_line_within_seconds(tiny, tmp_path, capsys, monkeypatch):
    from relay_tasks.rpc import start_server, start_tracker

    monkeypatch.setattr(device, "TRACKER_TIMEOUT", 2.0)
    tracker = start_tracker()
    server = start_server(("127.0.0.1", tracker.port), "the-device", port=9700)
    try:
        argv = [*tune_argv(tiny, "ansor", tmp_path / "w", 2), "--rpc-tracker",
                f"127.0.0.1:{tracker.port}", "--rpc-key", "the-devise"]  # fmt: skip
        started = time.monotonic()
        assert main(argv) == 7
        assert time.monotonic() - started < 30
    finally:
        server.terminate()
        tracker.terminate()
    err = capsys.readouterr().err
    assert err.startswith(f"relay-tasks: error: no device is registered at 127.0.0.1:{tracker.port} "
                          "under --rpc-key 'the-devise' (keys there: the-device); ")  # fmt: skip


def _wait_for(condition, seconds: float, child) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.25)


# The watch is the supervisor's, the same for every tuner.
@pytest.mark.parametrize("tuner", TUNERS_ONE_FAST)
def test_a_tune_goes_on_when_a_device_dies_and_ends_when_none_is_left(tuner, tiny, tmp_path):
    """Two servers under one key: one killed mid-tune, the tune measures on with the other;
    that one killed too, the tune ends within the measurement timeout plus a margin, in one
    line, its records kept (tuners themselves wait for a device for ever)."""
    import subprocess
    import sys

    from relay_tasks.rpc import start_server, start_tracker
    from relay_tasks.tuning.tune import DEVICE_MARGIN, DEVICE_POLL

    from tuned_models import valid_count, valid_count_or_zero

    tracker = start_tracker()
    servers = [start_server(("127.0.0.1", tracker.port), "relay-tasks-dies", port=9500 + 100 * i)
               for i in range(2)]  # fmt: skip
    work, timeout = tmp_path / "work", 5
    argv = [*tune_argv(tiny, tuner, work, 500), "--timeout", str(timeout),
            "--rpc-tracker", f"127.0.0.1:{tracker.port}", "--rpc-key", "relay-tasks-dies"]  # fmt: skip
    child = subprocess.Popen([sys.executable, "-m", "relay_tasks.cli", *argv],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for(lambda: valid_count_or_zero(work, tuner) >= 1, 240, child)
        servers[0].terminate()
        measured = valid_count(work, tuner)
        _wait_for(lambda: valid_count_or_zero(work, tuner) >= measured + 2, 120, child)
        servers[1].terminate()
        gone = time.monotonic()
        _, err = child.communicate(timeout=120)
        assert time.monotonic() - gone < timeout + DEVICE_MARGIN + 2 * DEVICE_POLL + 10
    finally:
        child.kill()
        tracker.terminate()
    assert child.returncode == relay_tasks.TuningError.exit_code
    lines = [line for line in err.splitlines() if not line.startswith("relay-tasks: tuning task")]
    kept = valid_count(work, tuner)
    assert len(lines) == 1 and lines[0].startswith(
        f"relay-tasks: error: no device is left under --rpc-key 'relay-tasks-dies' at 127.0.0.1:"
        f"{tracker.port} for {timeout + DEVICE_MARGIN:.0f} s, so the tune stopped; {kept} valid "
        "measurements are kept in "
    ), err


def test_devices_missing_for_less_than_the_grace_stop_nothing(monkeypatch) -> None:
    """A tune that ends while its devices have been missing for less than a measurement's
    timeout plus the margin ended by itself: the watch has no verdict to report."""
    import importlib

    from relay_tasks.adapters.base import Runner

    tuning = importlib.import_module("relay_tasks.tuning.tune")
    monkeypatch.setattr(tuning, "DEVICE_POLL", 0.0)
    monkeypatch.setattr(tuning, "devices_left", lambda tracker, key: "no device is left")
    watch = tuning._DeviceWatch(Runner(("127.0.0.1", 9190), "k", 5.0))
    assert not watch.gone() and not watch.gone()  # seen twice, for far less than 15 s
    assert watch.problem is None


@pytest.mark.parametrize("tuner", TUNERS_ONE_FAST)
def test_a_server_that_stops_answering_fails_one_measurement_not_the_tune(tuner, tiny, tmp_path):
    """Two servers under one key, the first registered stopped (SIGSTOP: still registered, a
    connection accepted, never an answer): the session the tracker gives it fails after the
    measurement timeout plus a margin, and the tune goes on with the other server.
    MetaSchedule's and Ansor's RPC runners made their pools without a timeout, and Ansor's
    first asked for a device in a session without one: the tune waited on the stopped server
    for ever."""
    import os
    import signal
    import subprocess
    import sys

    from relay_tasks.rpc import start_server, start_tracker

    from tuned_models import raw_measurements, valid_count

    tracker = start_tracker()
    servers = [start_server(("127.0.0.1", tracker.port), "relay-tasks-stops", port=9900 + 100 * i)
               for i in range(2)]  # fmt: skip
    stopped = servers[0].proc._proc.pid  # no session yet: the server has no children
    os.kill(stopped, signal.SIGSTOP)
    work = tmp_path / "work"
    argv = [*tune_argv(tiny, tuner, work, 4), "--timeout", "1",
            "--rpc-tracker", f"127.0.0.1:{tracker.port}", "--rpc-key", "relay-tasks-stops"]  # fmt: skip
    try:
        done = subprocess.run([sys.executable, "-m", "relay_tasks.cli", *argv],
                              capture_output=True, text=True, timeout=240)  # fmt: skip
    finally:
        os.kill(stopped, signal.SIGCONT)
        for server in servers:
            server.terminate()
        tracker.terminate()
    assert done.returncode == 0, done.stderr
    assert valid_count(work, tuner) >= 4
    assert any(seconds is None for _, seconds in raw_measurements(work, tuner))  # it was asked
