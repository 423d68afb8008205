"""The tuning child process: ``python -m relay_tasks.tuning.worker WORK_DIR TASKS TRIALS RUNNER
PARENT REUSE SEEDS``.

Reads its task file (data, checked like any task file), tunes into the work dir, and on
failure says why in one marked line for the supervisor (:mod:`relay_tasks.tuning.tune`). It runs
in a session of its own, so no terminal signal reaches it: when the supervisor dies without
stopping it (SIGKILL), it stops its whole process group itself.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..adapters import Adapter, TunerTask, get_adapter
from ..adapters.base import Runner, Tuned
from ..adapters.index import tally_in
from ..errors import describe_failure
from ..export import load_tasks
from .defaults import measure_defaults, read_defaults
from .tune import failure_mark, tuned_in


def main(argv: list[str]) -> int:
    folder, tasks, trials, runner = (
        Path(argv[0]),
        Path(argv[1]),
        json.loads(argv[2]),
        json.loads(argv[3]),
    )
    watch_parent(int(argv[4]))
    reuse = [Path(p) for p in json.loads(argv[5])]
    seeds = json.loads(argv[6]) is True
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
    try:
        loaded = load_tasks(tasks)
        tracker = tuple(runner["tracker"]) if runner["tracker"] else None
        options = Runner(tracker, runner["key"], runner["timeout"])
        adapter = get_adapter(loaded.tuner)
        if tracker is None:  # a device's defaults would be measured on it: not done yet
            measure_defaults(adapter, loaded.tasks, loaded.target, folder)
        tune_until(adapter, loaded.tasks, loaded.target, trials, folder, options,
                   teachers=lambda: other_tunes(folder, loaded.tasks, reuse),
                   seeds=seeds)  # fmt: skip
    except Exception as err:
        traceback.print_exc()
        print(f"{failure_mark(os.getpid())}{describe_failure(err)}", file=sys.stderr, flush=True)
        return 1
    return 0


def tune_until(
    adapter: Adapter,
    tasks: list[TunerTask],
    target: Any,
    trials: int | None,
    folder: Path,
    runner: Runner,
    teachers: Callable[[], Sequence[Tuned]] = tuple,
    seeds: bool = True,
) -> None:
    """Tuners spend their budget on attempts, failed ones included; passes go on until the
    records hold ``trials`` valid measurements, or ``BARREN_PASSES`` passes in a row add none
    (the supervisor then reports the failures). One barren pass is no verdict: Ansor's small
    rounds can draw only states that fail to instantiate. ``teachers`` gives the tasks tuned
    for other models, whose records a tuner may learn from; ``seeds``, whether it may start
    from the schedules shipped for the target's CPU family.

    ``trials=None`` (a time budget, which the supervisor keeps): passes of ``PASS_PER_TASK``
    measurements a task go on until stopped. A tuner given all the time as one budget spends
    it as its allocation plans for that budget; AutoTVM's goes task by task, so the last tasks
    would see none of a budget the time ends first."""
    valid, barren = _valid(adapter, tasks, folder), 0
    while (trials is None or valid < trials) and barren < BARREN_PASSES:
        goal = valid + PASS_PER_TASK * len(tasks) if trials is None else trials
        adapter.tune(tasks, target, goal, folder, runner, defaults=read_defaults(folder),
                     teachers=teachers, seeds=seeds)  # fmt: skip
        now = _valid(adapter, tasks, folder)
        barren = barren + 1 if now == valid else 0
        valid = now


BARREN_PASSES = 3
#: Valid measurements a task in one pass of a tune with a time budget only.
PASS_PER_TASK = 32


def other_tunes(folder: Path, tasks: Sequence[TunerTask], reuse: Sequence[Path] = ()
                ) -> list[Tuned]:  # fmt: skip
    """The tasks of ``folder``'s tunes of other models and of the work dirs ``reuse`` names
    (each derived again from its task file, checked as any is), less ``tasks``."""
    keys = {t.key for t in tasks}
    return [t for t in tuned_in([folder, *reuse]) if t.task.key not in keys]


#: Seconds between two looks for the supervisor.
PARENT_POLL = 0.5


def watch_parent(parent: int) -> None:
    """End this process group (the worker, its builders and runners) once ``parent`` is no
    longer this process's parent.

    A thread, not a signal handler: the tuners spend their time in C++, where Python's signal
    handlers wait, while TVM's FFI lets other threads run. SIGKILL, as the supervisor's own
    stop ends with: each finished measurement is already on disk, and the worker has nothing
    to tidy that a SIGTERM would let it do."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="relay-tasks-parent-watch", daemon=True).start()


def _valid(adapter: Adapter, tasks: list[TunerTask], folder: Path) -> int:
    return tally_in(adapter, folder).valid_for(t.key for t in tasks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
