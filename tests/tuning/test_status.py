"""``relay-tasks status``: the table, the model estimate, and the plot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relay_tasks.cli import main

from tuned_models import TUNERS, raw_measurements


@pytest.mark.parametrize("tuner", TUNERS)
def test_status_of_a_work_dir(tuner: str, tuned: dict[str, Path], tiny, capsys) -> None:
    work = tuned[tuner]
    assert main(["status", "--work-dir", str(work)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, rows, last = lines[0].split(), lines[1:-1], lines[-1]
    assert header == ["#", "task", "weight", "GFLOP", "trials", "valid", "failed", "best", "ms",
                      "share"]  # fmt: skip
    raw = raw_measurements(work, tuner)
    assert sum(int(r.split()[5]) for r in rows) == sum(1 for _, s in raw if s is not None)
    assert sum(int(r.split()[4]) for r in rows) == len(raw)
    assert all(float(r.split()[3]) > 0 for r in rows)  # GFLOP of a dense is not zero
    # The estimate is the weighted sum of each task's best, as the log has them.
    best: dict[str, float] = {}
    for task, seconds in raw:
        if seconds is not None:
            best[task] = min(best.get(task, seconds), seconds)
    weights = [int(r.split()[2]) for r in rows]
    assert len(best) == len(rows)
    expected = sum(w * b for w, b in zip(weights, best.values(), strict=True)) * 1e3
    shown = float(re.search(r"estimated model latency ([0-9.e-]+) ms", last).group(1))
    assert shown == pytest.approx(expected, rel=1e-3, abs=1e-4)
    # Given the model, the same tasks come from extraction.
    text, params = tiny
    assert main(["status", str(text), "--params", str(params), "--work-dir", str(work)]) == 0
    assert capsys.readouterr().out.splitlines() == lines


def test_plot(tuned: dict[str, Path], tmp_path: Path) -> None:
    image = tmp_path / "progress.png"
    assert main(["status", "--work-dir", str(tuned["autotvm"]), "--plot", str(image)]) == 0
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 10_000


def test_status_of_a_folder_that_is_no_work_dir(tmp_path: Path, capsys) -> None:
    assert main(["status", "--work-dir", str(tmp_path)]) == 2
    assert "is not a relay-tasks work dir" in capsys.readouterr().err
