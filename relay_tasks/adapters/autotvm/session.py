"""A tuning session: one ``XGBTuner`` per task, each task's share of the trials by its part of
the latency, a task with no records started from its similar tasks' best configs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tvm import autotvm
from tvm.autotvm.task.space import ConfigSpace, SplitEntity
from tvm.target import Target

from ..allocation import Allocation, apportion
from ..base import (
    Runner,
    Tuned,
    TunerTask,
)
from ..index import SEED, best_records, filled, tally
from ..similar import STARTS, Sizes, apart, keep_fastest, nearest
from .database import FILES, KNOB_VALUE, LOG, keep_records, log_records, outside, read
from .runner import measure_option
from .tasks import create_task, key, tensor_args


def tune(
    tasks: Sequence[TunerTask],
    target: Target,
    trials: int,
    work_dir: Path,
    runner: Runner,
    defaults: Mapping[str, float] = MappingProxyType({}),
    teachers: Callable[[], Sequence[Tuned]] = tuple,
    seeds: bool = True,
) -> None:
    """XGBTuner per task, until the log holds ``trials`` valid measurements in all, each task's
    share of them by its part of the latency known (``defaults``, the default schedules'
    latencies, and the records; see :func:`allotments`). A task's tuner learns its records,
    and a task with none first measures the best configs of its nearest similar tasks among
    these and ``teachers()`` (tasks tuned for other models, here or in ``--reuse`` dirs; see
    :class:`_Tutors`). A failed measurement does not count, so a rerun retries it.

    ``seeds`` is the protocol's: no schedules are shipped for AutoTVM (only MetaSchedule's,
    :mod:`..meta_schedule.seeds`)."""
    del seeds
    records = tally(read, work_dir, FILES)
    natives = [create_task(t.native.name, t.native.args, target) for t in tasks]
    tutors = _Tutors.of([Tuned(t, work_dir) for t in tasks], teachers())
    measured = records.measured()
    plan = allotments(
        trials,
        [records.of(t.key).valid for t in tasks],
        [len(n.config_space) for n in natives],
        Allocation(tasks, records, defaults).parts(),
    )
    full = filled(read, FILES, work_dir, [t.key for t in tasks], trials)
    with measure_option(runner) as measure:
        for task, remaining in zip(natives, plan, strict=True):
            if remaining == 0:
                continue
            starts = [] if key(task) in measured else tutors.starts(task)
            tuner = _Starting(task, starts, full, loss_type="reg")
            if tutors.history.get(key(task)):
                tuner.load_history(tutors.history[key(task)], min_seed_records=1)
            tuner.tune(
                n_trial=remaining,
                early_stopping=None,
                measure_option=measure,
                callbacks=[keep_records(work_dir), tutors.learn],
            )


class _Tutors:
    """Tuned tasks whose records teach a tune: a task with records (a tune resumed) goes on
    from them (:attr:`history`), and a task with none first measures the best configs of its
    nearest similar tasks (:meth:`starts`), this tune's own among them as they are measured.
    (AutoTVM's cost model cannot learn another shape's records: the number of its features
    changes with the loop nest, and XGBoost then refuses to predict.)

    Similar: the same template with the same knobs (a 1x1 convolution's template has other
    knobs than a 3x3's). A config's knob values are chosen among the task's own (the nearest
    split factors, the same options), so what is built is a point of its config space whatever
    the tutor's record holds. Nearest: :func:`.similar.nearest` over the template's tensor
    arguments.
    """

    def __init__(self) -> None:
        #: By task key: the task (with its config space), its form and its sizes.
        self.tasks: dict[str, tuple[autotvm.task.Task, tuple[Any, ...], Sizes]] = {}
        #: By task key: its fastest valid configs, (seconds, config), fastest first.
        self.best: dict[str, list[tuple[float, Any]]] = {}
        #: By task key: its records (a point of its config space each), as AutoTVM reads them.
        self.history: dict[str, list[tuple[Any, Any]]] = {}

    @classmethod
    def of(cls, *tuned: Sequence[Tuned]) -> _Tutors:
        """The records of every task in ``tuned``, read from its work dir's log."""
        tutors, folders = cls(), dict[Path, list[autotvm.task.Task]]()
        for one in (t for group in tuned for t in group):
            folders.setdefault(one.work_dir, []).append(one.task.native)
        for folder, natives in folders.items():
            tutors.read(folder, natives)
        return tutors

    def read(self, work_dir: Path, tasks: Sequence[autotvm.task.Task]) -> None:
        """The fastest records of ``tasks`` in ``work_dir`` (:data:`.index.SEED` a task: a
        bounded sample of a long history)."""
        for task in tasks:
            self.tasks[key(task)] = (task, _form(task), _sizes(task))
        chosen = best_records(read, FILES, work_dir, list(self.tasks), SEED)
        for record in log_records(work_dir / LOG, [line for line, _ in chosen]):
            known = self.tasks.get(record.key)
            if known is None or outside(record.knobs, known[0].config_space):
                continue  # another model's, or not what this task's search draws
            self.history.setdefault(record.key, []).append((record.inp, record.res))
            if record.seconds is not None:
                self.add(record.key, record.seconds, record.inp.config)

    def add(self, task_key: str, seconds: float, config: Any) -> None:
        keep_fastest(self.best.setdefault(task_key, []), seconds, config)

    def learn(self, tuner: Any, inputs: Any, results: Any) -> None:
        """An AutoTVM callback: a measured task tutors the similar tasks tuned after it."""
        for inp, res in zip(inputs, results, strict=True):
            if res.error_no == 0:
                self.add(key(inp.task), sum(res.costs) / len(res.costs), inp.config)

    def starts(self, task: autotvm.task.Task) -> list[int]:
        """The configs ``task`` starts from, as indices of its config space: its nearest
        similar tasks' fastest, each at the nearest point of its space, each once."""
        form, sizes = _form(task), _sizes(task)
        near = [(theirs, other) for other, (_, its, theirs) in self.tasks.items()
                if its == form and other != key(task) and self.best.get(other)]  # fmt: skip
        found: dict[int, None] = {}
        for other in nearest(sizes, near):
            for _, config in self.best[other]:
                index = _nearest_point(config, task.config_space)
                if index is not None:
                    found.setdefault(index)
        return list(found)[:STARTS]


def _form(task: autotvm.task.Task) -> tuple[Any, ...]:
    """What a config's knobs address: the template, and its knobs' names and kinds."""
    space = task.config_space.space_map
    return task.name, tuple((name, type(knob).__name__) for name, knob in space.items())


def _sizes(task: autotvm.task.Task) -> Sizes:
    return [tuple(tensor[1]) for tensor in tensor_args(task.args)], float(task.flop)


def _nearest_point(config: Any, space: ConfigSpace) -> int | None:
    """The index in ``space`` of the point nearest ``config`` (of a similar task's space):
    each knob's entity whose split factors are nearest, or whose choice is the same; None
    where a choice is not in ``space`` or the point is one its filter leaves out."""
    index, stride = 0, 1
    for name, knob in space.space_map.items():
        theirs = config[name]
        choice = _nearest_entity(theirs, knob.entities)
        if choice is None:
            return None
        index += choice * stride
        stride *= len(knob)
    return index if space.is_index_valid(index) else None


def _nearest_entity(theirs: Any, entities: Sequence[Any]) -> int | None:
    if isinstance(theirs, SplitEntity):
        # The first factor is what the others leave (-1 in a record).
        far = [apart([tuple(theirs.size[1:])], [tuple(e.size[1:])]) for e in entities]
        best = min(range(len(far)), key=far.__getitem__)
        return best if math.isfinite(far[best]) else None
    field = next(f for f in KNOB_VALUE.values() if hasattr(theirs, f))
    values = [getattr(e, field) for e in entities]
    wanted = getattr(theirs, field)
    return values.index(wanted) if wanted in values else None


class _Starting(autotvm.tuner.XGBTuner):  # type: ignore[misc]
    """XGBTuner whose first batch measures ``starts`` (indices of its space) before its own,
    and which stops once ``full()``: the work dir holds the tune's budget."""

    def __init__(self, task: autotvm.task.Task, starts: Sequence[int], full: Callable[[], bool],
                 **options: Any) -> None:  # fmt: skip
        super().__init__(task, **options)
        self.starts, self.full = list(starts), full

    def has_next(self) -> bool:
        return bool(super().has_next()) and not self.full()

    def next_batch(self, batch_size: int) -> list[Any]:
        first: list[Any] = []
        while self.starts and len(first) < batch_size:
            index = self.starts.pop(0)
            if index not in self.visited:
                self.visited.add(index)
                first.append(self.space.get(index))
        return first + list(super().next_batch(batch_size - len(first)))


def allotments(
    trials: int,
    valid: Sequence[int],
    spaces: Sequence[int],
    parts: Sequence[float] | None = None,
) -> list[int]:
    """Trials each task still gets: task i's share of ``trials`` is proportional to
    ``parts[i]`` (equal parts: ``trials // n``, one more for the first ``trials % n``), capped
    by its config space, less what it already holds; in all never more than ``trials`` less
    every valid measurement, so a task that ran past its share (a budget interrupted earlier)
    leaves the later tasks less rather than overshooting ``trials``."""
    shares = apportion(trials, [1.0] * len(valid) if parts is None else parts)
    left = max(0, trials - sum(valid))
    plan = []
    for have, space, share in zip(valid, spaces, shares, strict=True):
        take = min(left, max(0, min(share, space) - have))
        plan.append(take)
        left -= take
    return plan


def similar(tasks: Sequence[TunerTask], tuned: Callable[[], Sequence[Tuned]]) -> int:
    """How many of ``tasks`` a tune starts from the configs of similar tasks among ``tuned()``."""
    tutors = _Tutors.of(tuned())
    return sum(bool(tutors.starts(t.native)) for t in tasks)
