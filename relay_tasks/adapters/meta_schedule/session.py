"""A tuning session: MetaSchedule's task scheduler with rounds given by each task's part of the
estimated latency, random traces until the cost model has learnt, then evolutionary search
sized by the budget.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import tvm
from tvm import meta_schedule as ms
from tvm.target import Target

from ...host import fma_peak
from ..allocation import Allocation
from ..base import (
    Runner,
    Tuned,
    TunerTask,
)
from ..index import SEED, Tally, filled, tally
from ..similar import STARTS, STARTS_EACH, nearest, stem
from .database import (
    FILES,
    WorkDatabase,
    read,
    workload_key,
)
from .runner import CommitEach, Expected, builder_of, runner_of, task_records
from .seeds import Seed, count_seeded, shipped_for, sizes
from .tasks import flops, register_intrinsics


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
    """``ms.tune_tasks`` into a JSON database in ``work_dir`` until it holds ``trials`` valid
    measurements, each round to the task whose part of the estimated latency it is likeliest to
    cut (:mod:`.allocation`; ``defaults`` are the default schedules' latencies, by
    ``alternatives_of``; measured here, each task's FLOPs at this CPU's FMA peak are its
    floor).

    Until the cost model has learnt from ``WARMUP`` measurements it scores candidates at
    random, and an evolutionary search on random scores is random sampling at many times the
    cost (on DCGAN 15-30 s of search a round of 10): random traces are replayed until then,
    then each task is searched with the model, its population sized by the measurements the
    allocation expects to give it. The cost model first learns the work dir's records of these
    tasks and of ``teachers()`` (tasks tuned for other models, here or in ``--reuse`` dirs);
    a task with no records yet starts from the best schedules of its nearest similar tasks
    (:func:`_starts`), among them, with ``seeds``, those shipped for this CPU family
    (:mod:`.seeds`).
    """
    register_intrinsics(target)
    records = tally(read, work_dir, FILES)
    keys = [t.key for t in tasks]
    budget = trials - records.valid_for(keys)
    if budget <= 0:
        return
    full = filled(read, FILES, work_dir, keys, trials)
    shipped = shipped_for(target) if seeds else ()
    session = _Session(tasks, _with_num_cores(target), work_dir, runner, full, shipped)
    peak = None if runner.tracker else fma_peak(target)
    allocation = Allocation(tasks, records, defaults, [flops(t.native) for t in tasks], peak)
    warm = min(budget, max(0, WARMUP - session.learn(teachers())))
    if warm:
        session.phase(allocation, warm, _round(warm, WARM_BATCH), _replay, records)
        records = tally(read, work_dir, FILES)
    left = trials - records.valid_for(keys)
    if left > 0:
        session.phase(allocation, left, _round(left, BATCH), _search, records)


#: Measurements the cost model learns from before it scores candidates (upstream's: 100).
WARMUP = 32


#: Most measurements per round while candidates are drawn at random, and once searched: a
#: search costs about the same for any number it returns (15-25 s on DCGAN's convolutions at a
#: population of 128), a round is what the allocation gives at once.
WARM_BATCH, BATCH = 8, 32


#: Most records of one task the cost model learns from at a tune's start (its fastest).
LEARN_MOST = SEED  # what the work dir's database replays of each task for a tune


#: Fewest rounds a phase's budget is cut into, so that the allocation has rounds to give;
#: but never rounds of fewer than MIN_ROUND where the budget has more (every round restarts
#: the builder's processes: a second each).
ROUNDS, MIN_ROUND = 4, 4


def _round(budget: int, most: int) -> int:
    """Candidates a round for a phase of ``budget`` measurements."""
    return min(most, budget, max(MIN_ROUND, budget // ROUNDS))


class _Session:
    """What the phases of one tune share: loggers, seeds, the database and the cost model, and
    ``full()``, whether the work dir holds the tune's budget (:func:`.index.filled`)."""

    def __init__(self, tasks: Sequence[TunerTask], target: Target, work_dir: Path,
                 runner: Runner, full: Callable[[], bool], shipped: Sequence[Seed] = ()
                 ) -> None:  # fmt: skip
        self.tasks, self.target, self.work_dir, self.runner = tasks, target, work_dir, runner
        self.full, self.shipped = full, shipped
        self.loggers = ms.logging.get_loggers_from_work_dir(
            str(work_dir), [_file_part(t.name) for t in tasks]
        )
        self.seeds = ms.utils.fork_seed(None, n=len(tasks))
        self.database = WorkDatabase(work_dir, [t.native.dispatched[0] for t in tasks])
        self.cost_model = ms.cost_model.XGBModel(
            num_warmup_samples=WARMUP, num_tuning_cores=_physical_cores(), tree_method="auto"
        )
        self.expected = Expected()
        #: Every tuned task and the database of its records: these tasks, then ``learn``'s.
        self.tutors: list[tuple[TunerTask, Any]] = [(t, self.database.memory) for t in tasks]

    def learn(self, teachers: Sequence[Tuned] = ()) -> int:
        """Teach the cost model the work dir's records of these tasks (an earlier tune's,
        resumed) and of ``teachers`` (tasks tuned for other models, here or in other work
        dirs), who become :attr:`tutors` too;
        returns how many it learnt. MetaSchedule's model is not kept between tunes, and
        without them a resumed tune drew ``WARMUP`` random candidates again before its search
        could use the model (AutoTVM's tuners learn from their whole log so, Ansor's from its
        records of the model's own tasks)."""
        learnt, fed = 0, []
        mine = {t.key for t in self.tasks}
        folders: dict[Path, list[TunerTask]] = {}
        for tuned in teachers:
            if tuned.task.key not in mine:
                folders.setdefault(tuned.work_dir, []).append(tuned.task)
        for folder, theirs in folders.items():
            memory = WorkDatabase(folder, [t.native.dispatched[0] for t in theirs]).memory
            self.tutors += [(t, memory) for t in theirs]
        for task, memory in self.tutors:
            module = task.native.dispatched[0]
            if not memory.has_workload(module):
                continue
            candidates, results = [], []
            for record in memory.get_top_k(memory.commit_workload(module), LEARN_MOST):
                schedule = tvm.tir.Schedule(module)
                try:
                    record.trace.apply_to_schedule(schedule, remove_postproc=False)
                except tvm.TVMError:  # a trace this build cannot replay teaches nothing
                    continue
                candidates.append(ms.MeasureCandidate(schedule, record.args_info))
                results.append(ms.runner.RunnerResult(run_secs=record.run_secs, error_msg=None))
            if candidates:
                context = ms.TuneContext(mod=module, target=self.target, task_name=task.name)
                fed.append((context, candidates, results))
                learnt += len(candidates)
        # The model retrains on every update that grows its data by a fifth (4.4 s each for
        # ResNet-18's 64 records on a loaded host): every task's records in, then one training.
        model = self.cost_model
        for number, update in enumerate(fed, start=1):
            model.last_train_size = 0 if number == len(fed) else sys.maxsize
            model.update(*update)
        return learnt

    def phase(
        self,
        allocation: Allocation,
        limit: int,
        batch: int,
        strategy: Callable[[int], Any],
        records: Tally,
    ) -> None:
        """Rounds of ``batch`` candidates, ``strategy(expected measurements)`` searching each
        task, until ``limit`` candidates were measured (the last round may pass it); the first
        round of a task with no ``records`` (the work dir's, read at its start) measures the
        schedules :func:`_starts` finds it."""
        measured = records.measured()
        fresh = [t for t in self.tasks if t.key not in measured]
        starts = _starts(fresh, self.tutors, self.shipped)
        allocation.start_first([i for i, t in enumerate(self.tasks) if t.key in starts])
        contexts = [
            ms.TuneContext(
                mod=t.native.dispatched[0],
                target=self.target,
                space_generator="post-order-apply",
                search_strategy=_StartingFrom(strategy(count), starts[t.key])
                if t.key in starts
                else strategy(count),
                task_name=t.native.task_name,
                logger=logger,
                rand_state=seed,
                num_threads="physical",
            ).clone()
            for t, logger, seed, count in zip(
                self.tasks, self.loggers, self.seeds, allocation.expected(limit), strict=True
            )
        ]
        scheduler = _ByShare(allocation, self.full)
        ms.tune_tasks(
            tasks=contexts,
            task_weights=[float(t.weight) for t in self.tasks],
            work_dir=str(self.work_dir),
            max_trials_global=limit,
            num_trials_per_iter=batch,
            builder=builder_of(self.runner),
            runner=CommitEach(
                runner_of(self.runner), scheduler, self.database, allocation, self.expected
            ),
            database=self.database.memory,
            cost_model=self.cost_model,
            # The default callbacks less AddToDatabase: the runner has committed every record.
            measure_callbacks=[
                ms.measure_callback.RemoveBuildArtifact(),
                ms.measure_callback.UpdateCostModel(),
            ],
            task_scheduler=scheduler,
        )


def _physical_cores() -> int:
    from tvm.meta_schedule.utils import cpu_count

    return int(cpu_count(logical=False))


def _replay(expected: int) -> Any:
    return ms.search_strategy.ReplayTrace()


def _starts(tasks: Sequence[TunerTask], tutors: Sequence[tuple[TunerTask, Any]],
            shipped: Sequence[Seed] = ()) -> dict[str, list[Any]]:  # fmt: skip
    """By task key, the traces of the best records of each task's nearest similar tutors and
    ``shipped`` seeds (a seed of the very task is nearest of all).

    Similar: the same fused operators, told by the name MetaSchedule gives a task less the
    number that tells shapes apart; nearest: :func:`.similar.nearest` over the shapes of its
    buffers; only tutors with valid records count. A trace of one shape replays on another,
    its tile sizes redrawn where they no longer divide, as MetaSchedule's own search replays
    them; one that does not replay is dropped where it is used (:class:`_StartingFrom`).
    """
    # A task's own records are no start (a resumed tune has them); a shipped seed of it is.
    seen = {t.key for t in tasks}
    by_stem: dict[str, list[Seed]] = {}
    for tutor, memory in tutors:
        module = tutor.native.dispatched[0]
        if tutor.key in seen or not memory.has_workload(module):
            continue
        top = memory.get_top_k(memory.commit_workload(module), STARTS_EACH)  # valid ones only
        if top:
            seen.add(tutor.key)
            name = stem(tutor.native.task_name)
            by_stem.setdefault(name, []).append(
                Seed(tutor.key, name, sizes(tutor), tuple(r.trace for r in top))
            )
    for seed in shipped:
        by_stem.setdefault(seed.stem, []).append(seed)
    starts = {}
    for task in tasks:
        near = by_stem.get(stem(task.native.task_name), [])
        if not near:
            continue
        ordered = nearest(sizes(task), [(seed.sizes, seed) for seed in near])
        starts[task.key] = [trace for seed in ordered for trace in seed.traces][:STARTS]
    return starts


# TVM's derived_object replaces the class, which mutation tools cannot instrument.
@ms.derived_object
class _StartingFrom(ms.search_strategy.PySearchStrategy):  # type: ignore[misc]  # pragma: no mutate block
    """``inner``, whose first round measures ``traces`` (other tasks' schedules) replayed on
    this task, each finished by the task's postprocessors as MetaSchedule's search finishes
    the records it starts from; those that do not replay or finish are left out. Built when
    the task is first picked, not before (30 ms a trace)."""

    def __init__(self, inner: Any, traces: Sequence[Any]) -> None:
        super().__init__()
        self.inner, self.traces = inner, list(traces)
        self.context: Any = None
        self.started = self.own_round = False

    def _initialize_with_tune_context(self, context: Any) -> None:
        self.context = context
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int, design_spaces: Any,
                   database: Any = None, cost_model: Any = None) -> None:  # fmt: skip
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self) -> Any:
        if not self.started:
            self.started = True
            first = _replayed(self.context, self.traces)
            if first:
                self.own_round = True
                return first
        return self.inner.generate_measure_candidates()

    def notify_runner_results(self, candidates: Any, results: Any) -> None:
        if self.own_round:  # the inner strategy drew none of these
            self.own_round = False
            return
        self.inner.notify_runner_results(candidates, results)

    def clone(self) -> Any:
        return _StartingFrom(self.inner.clone(), self.traces)


def _replayed(context: Any, traces: Sequence[Any]) -> list[Any]:
    """Measure candidates of ``context``'s task from ``traces`` of other tasks, distinct."""
    postprocs = context.space_generator.postprocs
    candidates, seen = [], set()
    for trace in traces:
        schedule = tvm.tir.Schedule(context.mod, error_render_level="none")
        try:
            if isinstance(trace, list):  # a seed's, as JSON (:mod:`.seeds`)
                tvm.tir.schedule.Trace.apply_json_to_schedule(trace, schedule)
            else:
                trace.apply_to_schedule(schedule, remove_postproc=True)
            schedule.enter_postproc()
            finished = all(p.apply(schedule) for p in postprocs)
        except tvm.TVMError:
            continue
        key = workload_key(schedule.mod)
        if finished and key not in seen:
            seen.add(key)
            info = ms.arg_info.ArgInfo.from_entry_func(schedule.mod, remove_preproc=True)
            candidates.append(ms.MeasureCandidate(schedule, info))
    return candidates


# TVM's derived_object replaces the class, which mutation tools cannot instrument.
@ms.derived_object
class _ByShare(ms.task_scheduler.PyTaskScheduler):  # type: ignore[misc]  # pragma: no mutate block
    """MetaSchedule's task scheduler with :class:`.allocation.Allocation` choosing the rounds:
    no warm-up round of every task, the latency known before tuning counted from the start."""

    def __init__(self, allocation: Allocation, full: Callable[[], bool]) -> None:
        super().__init__()
        self.allocation, self.full = allocation, full
        self.last: int | None = None

    def next_task_id(self) -> int:
        if self.last is not None:
            self.allocation.round_done(self.last)
        scheduler = self._outer()
        alive = []
        for index, record in enumerate(task_records(scheduler)):
            # The runner hands back finished futures: the round just sent is joined here.
            ms.task_scheduler.TaskScheduler.touch_task(scheduler, index)
            if not record.is_terminated:
                alive.append(index)
        self.last = None if self.full() else self.allocation.pick(alive)
        return -1 if self.last is None else self.last


def _file_part(name: str) -> str:
    """A task name as part of a log file's name: MetaSchedule names each task's log after it, so
    a name from a task file (``../../x``) would otherwise place that log anywhere."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _search(budget: int) -> Any:
    """Evolutionary search sized for a task's ``budget`` of measurements. Its cost grows with
    the population (each generation mutates and scores all of it): upstream's 512 bred over 4
    generations is a minute of search a round on two cores, 256 over 2 still 25-30 s where the
    round's builds and runs take 10-20 s."""
    population = max(64, min(128, 4 * budget))
    return ms.search_strategy.EvolutionarySearch(
        population_size=population,
        init_min_unmeasured=min(50, population // 2),
        genetic_num_iters=4 if budget >= 64 else 2,
    )


def _with_num_cores(target: Target) -> Target:
    """MetaSchedule's CPU rules need ``-num-cores``; default to this machine's cores."""
    import os

    if target.kind.name == "llvm" and "num-cores" not in target.attrs:
        return Target(f"{target} -num-cores {os.cpu_count() or 1}", target.host)
    return target


def similar(tasks: Sequence[TunerTask], tuned: Callable[[], Sequence[Tuned]]) -> int:
    """How many of ``tasks`` have a similar task (:func:`_starts`) with valid records among
    ``tuned()``: those a tune starts from their schedules."""
    others = tuned()
    valid: dict[Path, set[str]] = {}
    for where in {t.work_dir for t in others}:
        valid[where] = {k for k, t in tally(read, where, FILES).tasks.items() if t.valid}
    stems = {stem(t.task.native.task_name) for t in others if t.task.key in valid[t.work_dir]}
    return sum(stem(t.native.task_name) in stems for t in tasks)


def seeded(tasks: Sequence[TunerTask], target: Target) -> int:
    """How many of ``tasks`` a tune starts from the seeds shipped for ``target``'s CPU family
    (:mod:`.seeds`), of the very task or of its operators at other shapes."""
    return count_seeded(shipped_for(target), (stem(t.native.task_name) for t in tasks))
