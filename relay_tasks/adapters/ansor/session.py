"""A tuning session: Ansor's gradient task scheduler started from the default schedules'
latencies, its cost model taught the work dir's records, tasks with none started from their
similar tasks' best states.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tvm import auto_scheduler
from tvm.target import Target

from ..allocation import FAILED_MEASUREMENTS
from ..base import (
    Runner,
    Tuned,
    TunerTask,
    cause_lines,
    failure_cause,
)
from ..index import (
    SEED,
    Records,
    as_tally,
    best_records,
    filled,
    records_of,
    tally,
)
from ..journal import append
from ..similar import STARTS, Sizes, keep_fastest, nearest
from .database import ERRORS_FILE, FILES, LOG, log_records, measure_failed, read
from .runner import runner_of, timeout_seconds
from .tasks import flops, key, measurable


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
    """Ansor's task scheduler (gradient, by weight) until the log holds ``trials`` valid
    measurements, starting from the default schedules' latencies (``defaults``, by
    ``alternatives_of``; see :class:`_FromDefaults`); the search effort scales down with the
    budget. Its cost model first learns the records of these tasks and of ``teachers()``
    (tasks tuned for other models, here or in ``--reuse`` dirs), and a task with no records
    starts from the best states of its nearest similar tasks (:class:`_Tutors`).

    ``seeds`` is the protocol's: no schedules are shipped for Ansor (only MetaSchedule's,
    :mod:`..meta_schedule.seeds`)."""
    del seeds
    records = tally(read, work_dir, FILES)
    budget = trials - records.valid_for(t.key for t in tasks)
    if budget <= 0:
        return
    natives = [measurable(t.native) for t in tasks]
    tutors = _Tutors.of([Tuned(t, work_dir) for t in tasks], teachers())
    per_round = max(1, min(BATCH, budget // len(tasks)))
    # Upstream's cost model, taught the tutors' records as read here: its own reading of a log
    # learns only workloads registered in this process, and fails on a log with none of them.
    model = auto_scheduler.XGBModel(num_warmup_sample=len(tasks) * per_round)
    if tutors.inputs:
        model.update(tutors.inputs, tutors.results)
    ours = {t.key for t in tasks} & records.measured()
    # Ansor's scheduler and search read what they start from with TVM's reader: they are
    # handed each task's fastest records, not the whole history of the log.
    with records_of(read, FILES, tasks, work_dir, SEED) as log:
        scheduler = _FromDefaults(
            natives,
            [t.weight for t in tasks],
            [defaults.get(t.alternatives_of) for t in tasks],
            records,
            tutors,
            model,
            work_dir,
            filled(read, FILES, work_dir, [t.key for t in tasks], trials),
            load_log_file=str(log) if ours else None,
            # Upstream's default writes total_latency.tsv into the current directory.
            callbacks=[
                auto_scheduler.task_scheduler.PrintTableInfo(),
                auto_scheduler.task_scheduler.LogEstimatedLatency(
                    str(work_dir / "total_latency.tsv")
                ),
            ],
        )
        preload = [auto_scheduler.PreloadMeasuredStates(str(log))] if ours else None
        search = _search(max(1, budget // len(tasks)))
        scheduler.tune(
            auto_scheduler.TuningOptions(
                # Ansor's scheduler measures every task before it weighs them: not fewer.
                num_measure_trials=max(budget, len(tasks)),
                num_measures_per_round=per_round,
                builder=auto_scheduler.LocalBuilder(
                    timeout=timeout_seconds(runner)
                ),  # --timeout too
                runner=runner_of(runner),
                measure_callbacks=[scheduler.keep],
            ),
            search_policy=[
                auto_scheduler.SketchPolicy(t, model, params=search, init_search_callbacks=preload)
                for t in natives
            ],
        )


class _Tutors:
    """Tuned tasks whose records teach a tune: its cost model learns from them (:attr:`inputs`
    and :attr:`results`), and a task with no records starts from the best states of its
    nearest similar ones (:meth:`starts`), this tune's own among them as they are measured.

    Similar: the same compute DAG at other extents (:func:`_form`), so that a state's steps,
    which name stages and iterators by number, address the same ones; a split of another
    extent leaves a remainder, which Ansor's lowering guards. Nearest: :func:`.similar.nearest`
    over the DAG's input and output shapes.
    """

    def __init__(self) -> None:
        #: By task key: the task, its form and its sizes.
        self.tasks: dict[str, tuple[auto_scheduler.SearchTask, tuple[Any, ...], Sizes]] = {}
        #: By task key: its fastest valid states, (seconds, state), fastest first.
        self.best: dict[str, list[tuple[float, Any]]] = {}
        self.inputs: list[Any] = []
        self.results: list[Any] = []

    @classmethod
    def of(cls, *tuned: Sequence[Tuned]) -> _Tutors:
        """The records of every task in ``tuned``, read from its work dir's log."""
        tutors, folders = cls(), dict[Path, list[auto_scheduler.SearchTask]]()
        for one in (t for group in tuned for t in group):
            folders.setdefault(one.work_dir, []).append(one.task.native)
        for folder, natives in folders.items():
            tutors.read(folder, natives)
        return tutors

    def read(self, work_dir: Path, tasks: Sequence[auto_scheduler.SearchTask]) -> None:
        """The fastest records of ``tasks`` in ``work_dir`` (:data:`.index.SEED` a task: a
        bounded sample of a long history for the cost model)."""
        for task in tasks:
            self.tasks[key(task)] = (task, _form(task), _sizes(task))
        chosen = best_records(read, FILES, work_dir, list(self.tasks), SEED)
        for record in log_records(work_dir / LOG, [line for line, _ in chosen]):
            if record.key in self.tasks:
                self.inputs.append(record.inp)
                self.results.append(record.res)
                if record.seconds is not None:
                    self.add(record.key, record.seconds, record.inp.state)

    def add(self, task_key: str, seconds: float, state: Any) -> None:
        keep_fastest(self.best.setdefault(task_key, []), seconds, state)

    def starts(self, task: auto_scheduler.SearchTask) -> list[Any]:
        """The states ``task`` starts from: its nearest similar tasks' fastest, each once (a
        task that started from another often keeps that one's states as its fastest)."""
        mine = self.tasks.get(key(task)) or (task, _form(task), _sizes(task))
        near = [(sizes, other) for other, (_, form, sizes) in self.tasks.items()
                if form == mine[1] and other != key(task) and self.best.get(other)]  # fmt: skip
        found: dict[str, Any] = {}
        for other in nearest(mine[2], near):
            for _, state in self.best[other]:
                found.setdefault(_steps(task, state), state)
        return list(found.values())[:STARTS]


def _steps(task: auto_scheduler.SearchTask, state: Any) -> str:
    """A state's steps as its record spells them (TVM serializes steps only in records)."""
    inp = auto_scheduler.MeasureInput(task, state)
    res = auto_scheduler.MeasureResult([0.0], 0, "", 0.0, 0.0)
    return json.dumps(
        json.loads(auto_scheduler.measure_record.dump_record_to_string(inp, res))["i"][1]
    )


def _form(task: auto_scheduler.SearchTask) -> tuple[Any, ...]:
    """What a state's steps address: the DAG's operations in order, each with its kind and its
    numbers of dimensions and of reduction axes."""
    return tuple((op.name, getattr(op, "tag", ""), len(op.output(0).shape),
                  len(getattr(op, "reduce_axis", ()))) for op in task.compute_dag.ops)  # fmt: skip


def _sizes(task: auto_scheduler.SearchTask) -> Sizes:
    dag = task.compute_dag
    return [tuple(int(d) for d in t.shape) for t in dag.tensors], flops(task)


class _Starting:
    """Stands in for a task's search policy for its first round: measures the states it starts
    from (:meth:`_Tutors.starts`), then hands them to the policy as measured (its evolution
    breeds from the fastest) and to the cost model, as the policy does with its own round."""

    def __init__(self, policy: Any, task: Any, states: Sequence[Any], scheduler: _FromDefaults
                 ) -> None:  # fmt: skip
        self.policy, self.task, self.states, self.scheduler = policy, task, states, scheduler

    def continue_search_one_round(self, count: int, measurer: Any) -> tuple[list[Any], Any]:
        options = self.scheduler.tune_option
        inputs = [auto_scheduler.MeasureInput(self.task, state) for state in self.states]
        results = options.runner.run(inputs, options.builder.build(inputs, verbose=0), verbose=0)
        self.scheduler.keep.callback(self.policy, inputs, results)
        with tempfile.TemporaryDirectory() as folder:
            measured = str(Path(folder) / LOG)
            auto_scheduler.save_records(measured, inputs, results)
            preload = auto_scheduler.PreloadMeasuredStates(measured)
            auto_scheduler._ffi_api.SearchPolicyRunCallbacks(self.policy, [preload])
        self.scheduler.model.update(inputs, results)
        return inputs, results


class _FromDefaults(auto_scheduler.TaskScheduler):  # type: ignore[misc]
    """Ansor's task scheduler, a task's default-schedule latency counted as its first round.

    Upstream's first measures every task once, in order, before it weighs any by its part of
    the latency: a short tune spends itself on the first tasks, whatever they weigh. A task
    whose default is known needs no such round: its best starts there (a search that does not
    beat it leaves it there), and the gradient weighs it from the start.
    """

    def __init__(self, tasks: list[Any], weights: list[int], defaults: list[float | None],
                 earlier: Records, tutors: _Tutors, model: Any, work_dir: Path,
                 full: Callable[[], bool], **options: Any) -> None:  # fmt: skip
        super().__init__(tasks, weights, **options)
        self.defaults, self.tutors, self.model, self.full = defaults, tutors, model, full
        #: What records every round (the measurer's callback; called by :class:`_Starting`).
        self.keep = _Keep(work_dir, self)
        #: Measurements tried and valid ones, by task key, earlier records included: a task
        #: left in one pass is not tried again in the next.
        summed = as_tally(earlier).tasks
        self.tried = Counter({k: t.valid + t.failed for k, t in summed.items()})
        self.valid = Counter({k: t.valid for k, t in summed.items()})
        self.dead_tasks.update(i for i, task in enumerate(tasks) if self._barren(task))
        self._count_defaults()

    def _barren(self, task: auto_scheduler.SearchTask) -> bool:
        task_key = key(task)
        return self.tried[task_key] >= FAILED_MEASUREMENTS and not self.valid[task_key]

    def _tune_task(self, task_idx: int) -> None:
        """One round; a task none of whose :data:`FAILED_MEASUREMENTS` measurements was valid
        is tuned no further (nor in later passes). Ansor weighs a failure
        as no improvement, so its gradient kept sending the rounds to the task holding the
        latency: a BERT's dense layers, whose every candidate failed in the layout rewrite
        before :func:`measurable`, took all 210 measurements of a tune of 64. Once the work
        dir holds the budget (``full()``; another tune may have filled it), every task is."""
        if self.full():
            self.dead_tasks.update(range(len(self.tasks)))
            return
        task = self.tasks[task_idx]
        states = [] if self.tried[key(task)] else self.tutors.starts(task)
        if not states:
            super()._tune_task(task_idx)
        else:
            policy = self.search_policies[task_idx]
            self.search_policies[task_idx] = _Starting(policy, task, states, self)
            try:
                super()._tune_task(task_idx)
            finally:
                self.search_policies[task_idx] = policy
        if self._barren(task):
            self.dead_tasks.add(task_idx)

    def measured(self, inputs: Any, results: Any) -> None:
        """Count a batch's measurements and valid ones (:class:`_Keep` hands each batch here)."""
        for inp, res in zip(inputs, results, strict=True):
            task_key = key(inp.task)
            self.tried[task_key] += 1
            if not measure_failed(res):
                self.valid[task_key] += 1
                self.tutors.add(task_key, sum(float(c) for c in res.costs) / len(res.costs),
                                inp.state)  # fmt: skip

    def _restore_status(self, log_file: str, num_measures_per_round: int) -> None:
        super()._restore_status(log_file, num_measures_per_round)
        self._count_defaults()  # a task no record of which was read

    def _count_defaults(self) -> None:
        for index, seconds in enumerate(self.defaults):
            if seconds is not None and self.task_cts[index] == 0:
                self.task_cts[index] = self.task_best_cts[index] = 1
                self.best_costs[index] = min(self.best_costs[index], seconds)
                self.task_costs_history[index].append(self.best_costs[index])
        self.cur_score = self._compute_score(self.best_costs)


class _Keep(auto_scheduler.measure.PythonBasedMeasureCallback):  # type: ignore[misc]
    """Append a batch's records and its failures' causes together, for the work dir's other
    writers (Ansor's ``RecordToFile`` writes through a C++ stream that can cut a line in two),
    and tell the scheduler which were valid."""

    def __init__(self, work_dir: Path, scheduler: _FromDefaults) -> None:
        super().__init__()
        self.work_dir = work_dir
        self.scheduler = scheduler

    def callback(self, policy: Any, inputs: Any, results: Any) -> None:
        self.scheduler.measured(inputs, results)
        records = [auto_scheduler.measure_record.dump_record_to_string(inp, res)
                   for inp, res in zip(inputs, results, strict=True)]  # fmt: skip
        causes = [failure_cause(str(res.error_msg)) for res in results if measure_failed(res)]
        append(self.work_dir, [(LOG, records), (ERRORS_FILE, cause_lines(causes))])


#: Most measurements per round: what an interrupt can lose.
BATCH = 16


def _search(budget: int) -> dict[str, Any]:
    """Sketch-policy effort sized for the budget and the round: upstream breeds a population of
    2048 over 4 generations for a round of 64 measurements; a round here measures at most
    ``BATCH``, a quarter of that, and so breeds at most a quarter (at 1632, DCGAN's 256, a
    round's search took 60-70 s of two cores to its 15 s of measuring)."""
    population = max(64, min(2048 * BATCH // 64, 32 * budget))
    return {
        "evolutionary_search_population": population,
        "evolutionary_search_num_iters": 4 if budget >= 64 else 2,
        "sample_init_min_population": min(50, population // 2),
    }


def similar(tasks: Sequence[TunerTask], tuned: Callable[[], Sequence[Tuned]]) -> int:
    """How many of ``tasks`` a tune starts from the states of similar tasks among ``tuned()``."""
    tutors = _Tutors.of(tuned())
    return sum(bool(tutors.starts(t.native)) for t in tasks)
