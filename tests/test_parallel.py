"""TVM-compiled loops run on every core, in this process and the processes it starts; the
launch that does it is never one another user could have planted."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import te

import relay_tasks
from relay_tasks import _parallel

#: Each iteration of a parallel loop writes the thread that ran it (its Linux thread id).
TEAM = 64


def threads() -> int:
    return int(os.environ["TVM_NUM_THREADS"])


@pytest.fixture(scope="module")
def who_ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A library whose one parallel loop records, per iteration, the thread that ran it."""
    out = te.compute((TEAM,), lambda i: tvm.tir.call_extern("int32", "gettid"), name="who")
    schedule = te.create_schedule(out.op)
    schedule[out].parallel(out.op.axis[0])
    built = tvm.build(schedule, [out], target=relay_tasks.host_target())
    path = tmp_path_factory.mktemp("parallel") / "who.so"
    built.export_library(str(path))
    return path


RUN = textwrap.dedent(
    """
    import sys, numpy as np, tvm
    run = tvm.runtime.load_module(sys.argv[1])
    out = tvm.nd.array(np.full(64, -1, dtype="int32"))
    run(out)
    print(len(set(out.numpy().tolist())))
    """
)


def test_this_host_has_cores_to_share() -> None:
    # Every test below needs two: the machines this runs on have two cores or more.
    assert _parallel.physical_cores() >= 2
    assert threads() >= 2  # TVM_NUM_THREADS, by default the physical cores


def test_a_parallel_loop_runs_on_a_thread_per_core(who_ran: Path) -> None:
    assert _parallel.active()
    out = tvm.nd.array(np.full(TEAM, -1, dtype="int32"))
    tvm.runtime.load_module(str(who_ran))(out)
    # hhb-tvm's own launch ran all 64 on the calling thread.
    assert len(set(out.numpy().tolist())) == threads()


def test_a_child_that_imports_tvm_first_runs_on_every_core_too(who_ran: Path) -> None:
    """TVM's measuring pool imports tvm before anything of ours (LD_PRELOAD reaches it)."""
    done = subprocess.run([sys.executable, "-c", RUN, str(who_ran)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.strip() == str(threads())


def test_tvm_num_threads_one_runs_on_one(who_ran: Path) -> None:
    env = {**os.environ, "TVM_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, str(who_ran)],
                          capture_output=True, text=True, check=True, env=env)  # fmt: skip
    assert done.stdout.strip() == "1"


class GroupEnv(ctypes.Structure):
    _fields_ = [("sync_handle", ctypes.c_void_p), ("num_task", ctypes.c_int32)]


Lambda = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(GroupEnv), ctypes.c_void_p)


@pytest.fixture(scope="module")
def launch() -> ctypes.CDLL:
    """The launch TVM-compiled code calls, called as that code calls it (ctypes lets go of the
    GIL in each call, so the team's tasks run their callbacks in turn and wait in C)."""
    library = _parallel.install()
    assert library is not None
    return ctypes.CDLL(str(library))


def _run(launch: ctypes.CDLL, task: Any, num_task: int = 0) -> int:
    return launch.TVMBackendParallelLaunch(Lambda(task), None, num_task)


def test_a_barrier_holds_every_task_until_all_arrive(launch: ctypes.CDLL) -> None:
    phases: list[tuple[int, int]] = []

    def task(task_id: int, env: Any, _: Any) -> int:
        for phase in range(50):
            phases.append((phase, task_id))
            launch.TVMBackendParallelBarrier(task_id, env)
        return 0

    assert _run(launch, task) == 0
    # Every task wrote phase p before any wrote p + 1: the barrier held.
    assert [phase for phase, _ in phases] == sorted(phase for phase, _ in phases)
    assert sorted(phases) == [(p, t) for p in range(50) for t in range(threads())]


def test_a_failing_task_fails_its_launch_and_the_next_runs(launch: ctypes.CDLL) -> None:
    assert _run(launch, lambda task_id, env, _: int(task_id == threads() - 1)) == -1
    ran: list[int] = []
    assert _run(launch, lambda task_id, env, _: ran.append(task_id) or 0) == 0
    assert sorted(ran) == list(range(threads()))


def test_a_launch_inside_a_task_runs_alone(launch: ctypes.CDLL) -> None:
    inner: list[tuple[int, int]] = []

    def nested(task_id: int, env: Any, _: Any) -> int:
        inner.append((task_id, env.contents.num_task))
        launch.TVMBackendParallelBarrier(task_id, env)  # alone: returns at once
        return 0

    def outer(task_id: int, env: Any, _: Any) -> int:
        return _run(launch, nested)

    assert _run(launch, outer) == 0
    assert inner == [(0, 1)] * threads()


def test_fewer_tasks_asked_than_threads_get_that_many(launch: ctypes.CDLL) -> None:
    seen: list[int] = []
    assert _run(launch, lambda task_id, env, _: seen.append(env.contents.num_task) or 0, 1) == 0
    assert seen == [1]


def _worker(launch: ctypes.CDLL) -> int:
    """The clock of the team's second thread (the CPU time it has spent)."""
    worker: dict[str, int] = {}

    def note(task_id: int, env: Any, _: Any) -> int:
        if task_id == 1:
            worker["thread"] = threading.get_ident()
        return 0

    assert _run(launch, note) == 0
    return time.pthread_getcpuclockid(worker["thread"])


def _busy_after_the_next_loop(launch: ctypes.CDLL, clock: int) -> float:
    """Seconds the worker waits busy after one more loop (then the caller sleeps)."""
    before = time.clock_gettime(clock)
    assert _run(launch, lambda *_: 0) == 0
    time.sleep(0.05)
    return time.clock_gettime(clock) - before


def _a_run_of_loops(launch: ctypes.CDLL) -> None:
    time.sleep(0.25)  # past any busy machine seen before
    for _ in range(50):  # in a row: the worker waits long between them
        assert _run(launch, lambda *_: 0) == 0


def test_after_a_late_team_mate_the_team_waits_busy_only_briefly(launch: ctypes.CDLL) -> None:
    """A task that ends far behind its caller's is a thread the system took off its core: the
    machine is busy, and a team-mate waiting busy would take the core it needs."""
    clock = _worker(launch)

    def late(task_id: int, env: Any, _: Any) -> int:
        if task_id == 1:
            time.sleep(0.005)  # held off its core for 5 ms
        return 0

    _a_run_of_loops(launch)
    assert _run(launch, late) == 0
    # After a run of loops on a quiet machine it waits busy 2 ms; here 10 us, then sleeps.
    assert _busy_after_the_next_loop(launch, clock) < 0.0005


def test_loops_far_apart_leave_the_team_asleep_between_them(launch: ctypes.CDLL) -> None:
    """A compile folding constants, or a tune, runs a few loops between long stretches of
    other work: a worker waiting 2 ms busy after each takes a core another process wants."""
    clock = _worker(launch)
    _a_run_of_loops(launch)
    time.sleep(0.01)  # longer than a wait busy: the run of loops ends
    assert _busy_after_the_next_loop(launch, clock) < 0.0005


FORK = textwrap.dedent(
    """
    import ctypes, os, sys
    from relay_tasks import _parallel
    Lambda = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    launch = ctypes.CDLL(str(_parallel.install())).TVMBackendParallelLaunch
    ran = []
    task = Lambda(lambda task_id, env, _: ran.append(task_id) or 0)
    assert launch(task, None, 0) == 0
    child = os.fork()
    if child == 0:
        ran.clear()
        code = launch(task, None, 0)
        os._exit(0 if code == 0 and sorted(ran) == list(range(int(sys.argv[1]))) else 3)
    print(os.waitpid(child, 0)[1])
    """
)


def test_a_forked_child_starts_a_team_of_its_own() -> None:
    """The parent's team stays behind in a fork; a child waiting on it would hang."""
    done = subprocess.run([sys.executable, "-c", FORK, str(threads())], capture_output=True,
                          text=True, check=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "0"


#: Compiled into the launch ahead of its own code: every ``syscall`` goes to ``lossy_syscall``.
LOSSY_HEADER = "#define syscall(...) lossy_syscall(__VA_ARGS__)\n"

#: ``lossy_syscall``: the system call, except that every futex wake-up is dropped.
LOSSY_SOURCE = textwrap.dedent(
    """
    #define _GNU_SOURCE
    #include <linux/futex.h>
    #include <stdarg.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    long lossy_syscall(long number, ...) {
      va_list args;
      long a[6];
      va_start(args, number);
      for (int i = 0; i < 6; ++i) a[i] = va_arg(args, long);
      va_end(args);
      if (number == SYS_futex && ((int)a[1] & FUTEX_CMD_MASK) == FUTEX_WAKE) return 0;
      return syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
    }
    """
)

ASLEEP = textwrap.dedent(
    """
    import ctypes, sys, time
    Lambda = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    launch = ctypes.CDLL(sys.argv[1]).TVMBackendParallelLaunch
    ran = []
    task = Lambda(lambda task_id, env, _: ran.append(task_id) or 0)
    for _ in range(3):
        time.sleep(0.05)  # long enough for the team to fall asleep
        assert launch(task, None, 0) == 0
    print(len(ran))
    """
)


def test_a_lost_wake_up_delays_a_loop_and_never_hangs_it(tmp_path: Path) -> None:
    """The launch built so that no sleeping thread is ever woken: each sleep must end by
    itself, so the loops still run, late."""
    (tmp_path / "lossy.h").write_text(LOSSY_HEADER)
    (tmp_path / "lossy.c").write_text(LOSSY_SOURCE)
    lossy = tmp_path / "lossy.o"
    subprocess.run(["gcc", "-c", "-O2", "-fPIC", str(tmp_path / "lossy.c"), "-o", str(lossy)],
                   check=True)  # fmt: skip
    library = tmp_path / "launch.so"
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-pthread", "-include",
                    str(tmp_path / "lossy.h"), str(_parallel.SOURCE), str(lossy), "-o",
                    str(library)], check=True)  # fmt: skip
    done = subprocess.run([sys.executable, "-c", ASLEEP, str(library)], capture_output=True,
                          text=True, check=True, timeout=10)  # fmt: skip
    assert done.stdout.strip() == str(3 * threads())


def _fresh(env: dict[str, str], cache: Path) -> dict[str, str]:
    """A process of its own, with ``cache`` for the built launch and nothing preloaded."""
    env = {k: v for k, v in env.items() if k not in ("LD_PRELOAD", "TVM_NUM_THREADS")}
    return {**env, "XDG_CACHE_HOME": str(cache)}


IMPORT = textwrap.dedent(
    """
    import relay_tasks
    from relay_tasks import _parallel
    print(_parallel.active(), _parallel.install())
    """
)


def _plant(folder: Path, marker: Path) -> Path:
    """A library at the launch's cache name whose loading writes ``marker``."""
    source = folder / "planted.c"
    source.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void run(void) "
        f'{{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
    )
    digest = _parallel._library().name  # the name this source builds under
    planted = folder / digest
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(planted)], check=True)
    return planted


@pytest.mark.parametrize("whose", ["a folder others can write", "a file others can write"])
def test_a_launch_planted_in_the_cache_is_never_loaded(tmp_path: Path, whose: str) -> None:
    cache = tmp_path / "cache"
    folder = cache / "relay-tasks"
    folder.mkdir(parents=True, mode=0o700)
    marker = tmp_path / "planted-ran"
    planted = _plant(folder, marker)
    if whose == "a folder others can write":
        folder.chmod(0o777)
    else:
        planted.chmod(0o777)
    done = subprocess.run([sys.executable, "-c", IMPORT], capture_output=True, text=True,
                          check=True, env=_fresh(dict(os.environ), cache))  # fmt: skip
    assert not marker.exists()
    assert done.stdout.split()[0] == "True"  # built afresh, and in use


def test_no_c_compiler_warns_once_and_runs_on_one_core(tmp_path: Path) -> None:
    env = {**_fresh(dict(os.environ), tmp_path / "cache"), "PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", IMPORT], capture_output=True, text=True,
                          check=True, env=env)  # fmt: skip
    assert done.stdout.split() == ["False", "None"]
    assert done.stderr.count("install gcc to use every core") == 1
