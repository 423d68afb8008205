"""Fixtures of the tuning tests: the tiny model, and a work dir per tuner tuned once.

Every tuning test is in the xdist group ``tuning``, so one worker runs them all and tunes each
work dir once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from relay_tasks.cli import main

from tuned_models import TUNERS, tune_argv, write_tiny


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/tuning/" in str(item.path):
            item.add_marker(pytest.mark.xdist_group("tuning"))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tuned(tiny: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A work dir per tuner holding 3 valid measurements of the tiny model."""
    dirs = {}
    for tuner in TUNERS:
        work = tmp_path_factory.mktemp(f"tuned-{tuner}")
        assert main(tune_argv(tiny, tuner, work, 3)) == 0
        dirs[tuner] = work
    return dirs
