"""Seeds from MetaSchedule work dirs: what ``./dev seeds`` ships for this CPU family.

Each task of the work dirs gives the search part of its fastest valid records' traces (their
postprocessing is redone for the task that replays them), with its stem and sizes, so that a
tune of another model finds them by task or by operator (:mod:`..adapters.meta_schedule.seeds`).
A task several work dirs tuned gives its fastest records over all of them: they were measured
on one machine, so their times compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm

from ..adapters.base import TunerTask
from ..adapters.meta_schedule.database import best_entries, trace_json
from ..adapters.meta_schedule.seeds import Seed, family, sizes
from ..adapters.similar import STARTS_EACH, stem
from ..errors import UsageError
from .tune import tasks_in


def seeds_of(work_dirs: Sequence[Path], cpu_family: str) -> list[Seed]:
    """The seeds for ``cpu_family`` of every task the MetaSchedule ``work_dirs`` tuned, by key,
    in the order first met. A work dir tuned for a target of another family is refused: its
    schedules use instructions, or layout blocks, the family's CPUs lack."""
    tasks: dict[str, TunerTask] = {}
    timed: dict[str, list[tuple[float, Any]]] = {}
    for work_dir in work_dirs:
        tuned = tasks_in(work_dir)
        if tuned.tuner != "meta_schedule":
            raise UsageError(f"{work_dir} holds {tuned.tuner} records; seeds are MetaSchedule's")
        if (its := family(tuned.target)) != cpu_family:
            raise UsageError(f"{work_dir} was tuned for '{tuned.target}' (CPU family {its}): "
                             f"seeds for {cpu_family} come from tunes for that family")  # fmt: skip
        here = {t.key: t for t in tuned.tasks}
        for entry in best_entries(work_dir, here, STARTS_EACH):
            task = tasks.setdefault(entry.key, here[entry.key])
            seconds = sum(entry.run_secs) / len(entry.run_secs)
            timed.setdefault(entry.key, []).append((seconds, _search_part(task, entry.trace)))
    return [Seed(key, stem(task.native.task_name), sizes(task),
                 tuple(trace for _, trace in sorted(timed[key], key=lambda p: p[0])[:STARTS_EACH]))
            for key, task in tasks.items()]  # fmt: skip


def _search_part(task: TunerTask, trace: Any) -> Any:
    """``trace`` (a record's, as JSON) replayed on ``task``'s function, less what its
    postprocessors did."""
    schedule = tvm.tir.Schedule(task.native.dispatched[0])
    tvm.tir.schedule.Trace.apply_json_to_schedule(trace, schedule)
    return trace_json(schedule.trace, remove_postproc=True)
