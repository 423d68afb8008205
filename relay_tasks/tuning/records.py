"""What a work dir's records say about each task: trials, valid and failed measurements, best.

Every tuner logs differently (MetaSchedule's JSON database, AutoTVM's log, Ansor's log); each
adapter reads its own into :class:`~relay_tasks.adapters.base.Measurement` rows, and everything
after that (progress, summaries, coverage, the latency estimate) is tuner-neutral and lives here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..adapters.base import Measurement, TunerTask
from ..adapters.index import Records, as_tally


@dataclass(frozen=True)
class TaskRecord:
    """One task's standing in the records."""

    task: TunerTask
    valid: int
    failed: int
    best: float | None  # seconds, over valid measurements
    first_error: str
    causes: tuple[tuple[str, int], ...] = ()  # failures' causes, the most common first
    default: float | None = None  # seconds with TVM's default schedule, where measured
    #: Seconds of its best record built alone and timed as its default is, where ``compile``
    #: timed it so: a tuner times a kernel its own way (AutoTVM's ``conv2d_NCHWc`` without the
    #: layout transforms around it), and the build takes the record only where this beats the
    #: default.
    alike: float | None = None

    @property
    def trials(self) -> int:
        return self.valid + self.failed

    @property
    def as_built(self) -> float | None:
        """Its best record's latency as the build weighs it against the default."""
        return self.alike if self.alike is not None else self.best


@dataclass(frozen=True)
class Standing:
    """All tasks' standing, and what it means for the model."""

    tasks: list[TaskRecord]

    @property
    def valid(self) -> int:
        return sum(t.valid for t in self.tasks)

    @property
    def failed(self) -> int:
        return sum(t.failed for t in self.tasks)

    @property
    def first_error(self) -> str:
        return next((t.first_error for t in self.tasks if t.first_error), "")

    @property
    def untuned(self) -> list[TaskRecord]:
        """Tasks no valid measurement covers: not measured, nor any alternative of theirs."""
        covered = {t.task.alternatives_of for t in self.tasks if t.best is not None}
        return [t for t in self.tasks if t.task.alternatives_of not in covered]

    @property
    def chosen(self) -> list[TaskRecord]:
        """The tasks a build with the best records runs: of alternative implementations of one
        primitive function, the fastest measured, unless TVM's default schedule of that
        function is faster still (then the build takes the default)."""
        best: dict[str, TaskRecord] = {}
        for t in self.tasks:
            if t.best is None:
                continue
            held = best.get(t.task.alternatives_of)
            if held is None or t.best < held.best:  # type: ignore[operator]
                best[t.task.alternatives_of] = t
        return [t for t in best.values() if t.default is None or t.as_built < t.default]  # type: ignore[operator]

    @property
    def latency(self) -> float | None:
        """The model's latency estimated from the records: per primitive function, its weight
        times the faster of its best record (of any alternative) and its default schedule,
        summed; None until every function has one or the other."""
        fastest: dict[str, float] = {}
        for t in self.tasks:
            options = [s for s in (t.as_built, t.default) if s is not None]
            if options:
                group = t.task.alternatives_of
                seconds = t.task.weight * min(options)
                fastest[group] = min(fastest.get(group, seconds), seconds)
        groups = {t.task.alternatives_of for t in self.tasks}
        if not self.tasks or len(fastest) < len(groups):
            return None
        return sum(fastest.values())


def standing(
    tasks: Sequence[TunerTask],
    records: Records,
    defaults: Mapping[str, float] | None = None,
    alike: Mapping[tuple[str, float], float] | None = None,
) -> Standing:
    """Each task's standing in ``records``; ``defaults`` are the latencies of the default
    schedules (by ``alternatives_of``), where measured, and ``alike`` those of best records
    timed the same way (by task key and best)."""
    defaults, alike = defaults or {}, alike or {}
    summed = as_tally(records)
    rows = []
    for task in tasks:
        mine = summed.of(task.key)
        best = mine.best[0][0] if mine.best else None
        rows.append(
            TaskRecord(
                task,
                valid=mine.valid,
                failed=mine.failed,
                best=best,
                first_error=mine.first_error,
                causes=tuple(mine.causes.most_common()),
                default=defaults.get(task.alternatives_of),
                alike=None if best is None else alike.get((task.key, best)),
            )
        )
    return Standing(rows)


def latency_by_trial(
    tasks: Sequence[TunerTask],
    measurements: Sequence[Measurement],
    defaults: Mapping[str, float] | None = None,
) -> list[tuple[int, float]]:
    """(measurements so far, estimated model latency) after each measurement, from the point
    every task (or an alternative of it) has a valid one or a default: the curve ``status
    --plot`` draws."""
    group = {t.key: t.alternatives_of for t in tasks}
    weights = {t.alternatives_of: t.weight for t in tasks}
    best = {g: s for g, s in (defaults or {}).items() if g in weights}
    curve = []
    for count, m in enumerate(measurements, start=1):
        if m.key in group and m.valid:
            seconds, of = float(m.seconds), group[m.key]  # type: ignore[arg-type]
            best[of] = min(best.get(of, seconds), seconds)
        if len(best) == len(weights):
            curve.append((count, sum(weights[g] * s for g, s in best.items())))
    return curve


def latency_by_time(
    tasks: Sequence[TunerTask],
    measurements: Sequence[Measurement],
    defaults: Mapping[str, float] | None = None,
) -> list[tuple[float, float]] | None:
    """:func:`latency_by_trial` against the seconds since the first measurement, or None when
    some measurement has no time (MetaSchedule's own writer keeps none)."""
    if any(m.at is None for m in measurements):
        return None
    start = min((float(m.at) for m in measurements if m.at is not None), default=0.0)
    return [(float(measurements[count - 1].at) - start, latency)  # type: ignore[arg-type]
            for count, latency in latency_by_trial(tasks, measurements, defaults)]  # fmt: skip
