from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from relay_tasks import scratch
from relay_tasks.scratch import scratch_dir, sweep


@pytest.fixture
def gone() -> int:
    """The id of a process that has ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _folder(root: Path, name: str, age: float = 2 * scratch.STALE_SECONDS) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "tvm_tmp_mod.tar.so").write_bytes(b"left by a builder")
    then = time.time() - age
    os.utime(folder, (then, then))
    return folder


def test_making_a_folder_sweeps_its_kind_left_by_gone_processes(
    gone: int, tmp_path: Path, monkeypatch
) -> None:
    """Only a stale folder of the same kind whose process is gone goes: not a live process's,
    not one touched lately, not another kind's, not a link or a file under such a name."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = _folder(tmp_path, f"relay-tasks-worker-{gone}-a1_b")
    kept = [
        _folder(tmp_path, f"relay-tasks-worker-{os.getpid()}-a1_b"),
        _folder(tmp_path, f"relay-tasks-worker-{gone}-recent", age=60),
        _folder(tmp_path, f"relay-tasks-records-{gone}-a1_b"),
        _folder(tmp_path, f"relay-tasks-worker-{gone}"),
    ]
    outside = _folder(tmp_path, "elsewhere")
    link = tmp_path / f"relay-tasks-worker-{gone}-link"
    link.symlink_to(outside)
    plain = tmp_path / f"relay-tasks-worker-{gone}-file"
    plain.write_text("not a folder")
    with scratch_dir("worker") as made:
        assert made.is_dir() and made.name.startswith(f"relay-tasks-worker-{os.getpid()}-")
        assert list(made.iterdir()) == []
        assert not left.exists()
    assert not made.exists()
    assert all(folder.is_dir() for folder in kept)
    assert link.is_symlink() and (outside / "tvm_tmp_mod.tar.so").exists() and plain.exists()


def test_another_users_folder_is_never_removed(gone: int, tmp_path: Path, monkeypatch) -> None:
    theirs = _folder(tmp_path, f"relay-tasks-records-{gone}-a1_b")
    monkeypatch.setattr(os, "geteuid", lambda: theirs.stat().st_uid + 1)
    assert sweep("records", tmp_path) == 0 and theirs.is_dir()
    monkeypatch.undo()
    assert sweep("records", tmp_path) == 1 and not theirs.exists()


def test_a_missing_temporary_folder_sweeps_nothing(tmp_path: Path) -> None:
    assert sweep("worker", tmp_path / "missing") == 0
