"""``./dev`` runs from any directory: model paths and ``-o`` are the caller's, not the repo's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tuned_models import write_tiny
from zoo import X86

DEV = Path(__file__).resolve().parent.parent / "dev"


def test_dev_keeps_the_callers_directory(tmp_path: Path) -> None:
    text, params = write_tiny(tmp_path)
    command = [str(DEV), "relay-tasks", "extract", text.name, "--params", params.name,
               "--target", X86, "-o", "tasks.txt"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tasks.txt").read_text().splitlines()[1].split()[
        1
    ] == "fused_nn_dense_nn_relu"
