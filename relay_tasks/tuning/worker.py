"""The tuning child process: ``python -m relay_tasks.tuning.worker WORK_DIR TRIALS RUNNER``.

Reads the work dir's task file (data, checked like any task file), tunes, and on failure says
why in one marked line for the supervisor (:mod:`relay_tasks.tuning.tune`).
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

from ..adapters import Adapter, TunerTask, get_adapter
from ..adapters.base import Runner
from ..errors import describe_failure
from ..export import load_tasks
from .tune import FAILURE_MARK, TASKS_FILE


def main(argv: list[str]) -> int:
    folder, trials, runner = Path(argv[0]), int(argv[1]), json.loads(argv[2])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
    try:
        loaded = load_tasks(folder / TASKS_FILE)
        tracker = tuple(runner["tracker"]) if runner["tracker"] else None
        options = Runner(tracker, runner["key"], runner["timeout"])
        tune_until(get_adapter(loaded.tuner), loaded.tasks, loaded.target, trials, folder, options)
    except Exception as err:
        traceback.print_exc()
        print(f"{FAILURE_MARK}{describe_failure(err)}", file=sys.stderr, flush=True)
        return 1
    return 0


def tune_until(
    adapter: Adapter, tasks: list[TunerTask], target: Any, trials: int, folder: Path, runner: Runner
) -> None:
    """Tuners spend their budget on attempts, failed ones included; passes go on until the
    records hold ``trials`` valid measurements, or ``BARREN_PASSES`` passes in a row add none
    (the supervisor then reports the failures). One barren pass is no verdict: Ansor's small
    rounds can draw only states that fail to instantiate."""
    valid, barren = _valid(adapter, tasks, folder), 0
    while valid < trials and barren < BARREN_PASSES:
        adapter.tune(tasks, target, trials, folder, runner)
        now = _valid(adapter, tasks, folder)
        barren = barren + 1 if now == valid else 0
        valid = now


BARREN_PASSES = 3


def _valid(adapter: Adapter, tasks: list[TunerTask], folder: Path) -> int:
    return sum(m.valid for m in adapter.measurements(folder))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
