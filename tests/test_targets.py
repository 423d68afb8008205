"""Targets read from files pass an allowlist before TVM parses them (issue 50, item 1).

An ``llvm`` target's ``-cl-opt`` is handed to LLVM's command-line parser: with a checksum
recomputed, a task file or a work dir could make LLVM run a program it names, write a file
anywhere, or corrupt memory. A file's target is now refused unless it is a kind we tune for with
only the attributes that choose code, each a plain value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tvm
from test_export import _sealed

import relay_tasks
from relay_tasks.cli import main
from relay_tasks.export import dumps, tasks_document
from relay_tasks.targets import target_problem

from zoo import AARCH64, CUDA, HOST, X86, load

#: What TVM prints for targets users tune for (str(Target) is what files carry).
WRITTEN = [
    HOST,
    X86,
    CUDA,
    AARCH64,
    "nvidia/geforce-rtx-3080",
    "llvm -device=arm_cpu -mtriple=aarch64-linux-gnu -model=rk3588 -num-cores=4",
    "llvm -mtriple=x86_64-linux-gnu -mcpu=znver4 -opt-level=3 -fast-math",
    "llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids -mattr=+avx512f,+amx-tile,-avx512-fp16",
    "llvm -mtriple=riscv64-unknown-linux-gnu -mcpu=generic-rv64 -mattr=+m,+a,+f,+d,+c,+v -mabi=lp64d",
]


@pytest.mark.parametrize("target", WRITTEN)
def test_every_target_a_user_tunes_for_reads_back(target: str) -> None:
    assert target_problem(str(tvm.target.Target(target))) is None


CL_OPT = "-cl-opt=-print-changed:int=7,-dot-cfg-dir:string=/tmp,-print-changed-dot-path:string=x"
REFUSED = {
    "cl-opt": (f"{X86} {CL_OPT}", "its target sets '-cl-opt', which a file may not set for llvm"),
    "a bool as a string": (
        f"{X86} -cl-opt=-print-after-all:string=AAAA",
        "its target sets '-cl-opt'",
    ),
    "libs": ("cuda -arch=sm_80 -libs=cublas,cudnn", "its target sets '-libs'"),
    "host": (f"cuda -arch=sm_80 -host={X86.replace(' ', '_')}", "its target sets '-host'"),
    "kind": ("opencl -device=mali", "its target kind 'opencl' is not one relay-tasks tunes for"),
    "ext_dev": ("ext_dev", "its target kind 'ext_dev'"),
    "a value with a colon": (
        "llvm -mcpu=x:string=y",
        "its target's -mcpu is 'x:string=y', not a plain value",
    ),
    "no value": ("llvm -mcpu", "its target's -mcpu is '', not a plain value"),
    "a space-separated value": ("llvm -mcpu skylake", "its target's -mcpu is ''"),
    "a number out of range": ("llvm -opt-level=9", "its target's -opt-level is '9'"),
    "a json target": ('{"kind": "llvm"}', "its target kind '{\"kind\":'"),
    "control characters": ("llvm\n-mcpu=skylake", "its target is not a short line of plain text"),
    "too long": ("llvm " + "-mcpu=x " * 200, "its target is not a short line of plain text"),
    "not a string": (7, "its target is not a short line of plain text"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_a_file_may_not_set_is_named(case: str) -> None:
    text, message = REFUSED[case]
    problem = target_problem(text)
    assert problem is not None and problem.startswith(message), problem


@pytest.fixture(scope="module")
def task_document() -> dict:
    mod, params = load("conv_bias_bn_relu")
    tasks = relay_tasks.extract(mod, HOST, params, tuner="meta_schedule")
    target = tvm.target.Target(HOST)
    return json.loads(dumps(tasks_document(tasks, tuner="meta_schedule", target=target,
                                           models=["m"])))  # fmt: skip


def _with_target(document: dict, target: str) -> str:
    return dumps(_sealed({**document, "target": target}))


def test_a_work_dirs_target_with_cl_opt_is_refused_by_every_reader(
    task_document, tmp_path: Path, capsys
) -> None:
    """Through the CLI: ``status``, ``compile`` and ``tune`` of a work dir whose resealed
    ``tasks.json`` asks LLVM to write its pass dump into a folder; each refuses in one line
    naming the file and the attribute, and LLVM writes nothing there."""
    dump = tmp_path / "dump"
    dump.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    opt = f"-cl-opt=-print-changed:int=7,-dot-cfg-dir:string={dump}"
    (work / "tasks.json").write_text(_with_target(task_document, f"{HOST} {opt}"))
    commands = {
        "status": ["status", "--work-dir", str(work)],
        "tune": ["tune", str(work / "tasks.json"), "--trials", "1", "--work-dir", str(work)],
    }
    for verb, argv in commands.items():
        assert main(argv) == 3, verb
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert "tasks.json: its target sets '-cl-opt', which a file may not set" in err, err
    assert list(dump.iterdir()) == []
