"""TVM-compiled loops run on every core, in this process and the processes it starts; the
launch that does it is never one another user could have planted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import te

import relay_tasks
from relay_tasks import _parallel

#: Each iteration of a parallel loop writes the OpenMP thread that ran it.
TEAM = 64


def threads() -> int:
    return int(os.environ["TVM_NUM_THREADS"])


@pytest.fixture(scope="module")
def who_ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A library whose one parallel loop records, per iteration, the thread that ran it."""
    out = te.compute(
        (TEAM,), lambda i: tvm.tir.call_extern("int32", "omp_get_thread_num"), name="who"
    )
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
    print(sorted(set(out.numpy().tolist())))
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
    # hhb-tvm's own launch ran all 64 on thread 0.
    assert sorted(set(out.numpy().tolist())) == list(range(threads()))


def test_a_child_that_imports_tvm_first_runs_on_every_core_too(who_ran: Path) -> None:
    """TVM's measuring pool imports tvm before anything of ours (LD_PRELOAD reaches it)."""
    done = subprocess.run([sys.executable, "-c", RUN, str(who_ran)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.strip() == str(list(range(threads())))


def test_tvm_num_threads_one_runs_on_one(who_ran: Path) -> None:
    env = {**os.environ, "TVM_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, str(who_ran)],
                          capture_output=True, text=True, check=True, env=env)  # fmt: skip
    assert done.stdout.strip() == "[0]"


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
