"""MetaSchedule: shared tasks -> ``tvm.meta_schedule.ExtractedTask``, equal to upstream's.

Upstream (``relay.backend.MetaScheduleExtractTask``) turns every primitive function occurrence
into a TIR module and deduplicates on *that* with the chosen module equality, so this adapter does
the same over the backend's occurrences: TIR once per distinct function, then upstream's order
(post order reversed; sorted by op count first for ``anchor-block``) and naming.
"""

from __future__ import annotations

import importlib
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import tvm
from tvm import meta_schedule as ms
from tvm import relay
from tvm.ir import IRModule
from tvm.ir.supply import NameSupply
from tvm.meta_schedule.utils import derived_object
from tvm.target import Target

from ..errors import ModelError
from ..inputs import ParamsLike, TargetLike
from ..lowering.cxx import std_sort
from ..lowering.extract import Task, lower_function, run_extraction, warn_skipped_dynamic
from ..optimize.pipeline import PassSettings, extraction_scope
from ..request import Request
from .allocation import Allocation
from .base import (
    SESSION_MARGIN,
    Adapter,
    Measurement,
    Runner,
    Tuned,
    TunerTask,
    failure_cause,
)
from .database import (
    ERRORS,
    FILES,
    RECORDS,
    TIMES,
    WORKLOADS,
    WorkDatabase,
    read,
    read_times,
    workload_key,
)
from .functions import read_source, source_data
from .index import SEED, Tally, filled, history, tally
from .similar import STARTS, STARTS_EACH, Sizes, nearest, stem
from .untuned import covered_by, untuned_as_without, variants_of, warn_unused
from .verify import CANDIDATES, best_agreeing, results, runs_here

NAME = "meta_schedule"
MODULE_EQUALITIES = ("structural", "ignore-ndarray", "anchor-block")
#: Upstream's defaults: strategies pick by plevel, and TE becomes TIR with the default converter.
DEFAULT_PASS_CONFIG: Mapping[str, Any] = MappingProxyType(
    {"relay.backend.use_meta_schedule": True, "relay.backend.tir_converter": "default"}
)


def extract_task_from_relay(
    mod: Any,
    target: TargetLike,
    params: ParamsLike = None,
    *,
    opt_level: int = 3,
    pass_config: Mapping[str, Any] = DEFAULT_PASS_CONFIG,
    disabled_pass: Any = None,
    module_equality: str = "structural",
    executor: Any = None,
) -> list[ms.ExtractedTask]:
    """Extract MetaSchedule tuning tasks, equal to ``ms.relay_integration.extract_tasks``.

    Parameters
    ----------
    mod : tvm.IRModule or tvm.relay.Function
        The model.
    target : str or tvm.target.Target
        The target to tune for.
    params : dict of str to numpy.ndarray or tvm.nd.NDArray, optional
        Weights bound into ``main`` by name.
    opt_level, pass_config, disabled_pass
        The PassContext; ``pass_config`` replaces upstream's default as it does upstream.
    module_equality : {"structural", "ignore-ndarray", "anchor-block"}
        How TIR modules are compared when deduplicating tasks.
    executor : relay.backend.Executor, optional
        Attached to a module that names no executor (default: the graph executor), as upstream
        does; with ``link-params`` it decides whether weights become part of the tasks.

    Returns
    -------
    list of tvm.meta_schedule.ExtractedTask
        Ready for ``ms.tune_tasks`` / ``ms.relay_integration.tune_relay``.
    """
    equality = _checked_equality(module_equality)
    request = Request.of(mod, target, params, _settings(opt_level, pass_config, disabled_pass))
    pairs = _extract(request, equality, executor)
    return [extracted for _, extracted in pairs]


def extract(
    mod: Any, target: TargetLike, params: ParamsLike = None, **options: Any
) -> list[TunerTask]:
    """The registry's entry point: :func:`extract_task_from_relay` as :class:`TunerTask` rows."""
    settings = _settings(
        options.pop("opt_level", 3),
        options.pop("pass_config", DEFAULT_PASS_CONFIG),
        options.pop("disabled_pass", None),
    )
    module_equality = _checked_equality(options.pop("module_equality", "structural"))
    if options:
        raise ModelError(f"unknown MetaSchedule option(s): {', '.join(sorted(options))}")
    pairs = _extract(Request.of(mod, target, params, settings), module_equality)
    return [
        TunerTask(et.task_name, int(et.weight), task.anchor_op, key(et), et, source=task)
        for task, et in pairs
    ]


def key(task: ms.ExtractedTask) -> str:
    """MetaSchedule tunes the TIR module: equal modules are one task, across models too."""
    return workload_key(task.dispatched[0])


def _settings(opt_level: int, pass_config: Mapping[str, Any], disabled_pass: Any) -> PassSettings:
    return PassSettings(opt_level, dict(pass_config), frozenset(disabled_pass or ()))


def _checked_equality(module_equality: str) -> str:
    if module_equality not in MODULE_EQUALITIES:
        raise ModelError(
            f"unknown module_equality {module_equality!r}; "
            f"choose one of {', '.join(MODULE_EQUALITIES)}"
        )
    return module_equality


def _extract(
    request: Request, module_equality: str, executor: Any = None
) -> list[tuple[Task, ms.ExtractedTask]]:
    request = replace(request, mod=with_executor(request.mod, executor))
    # Upstream walks main only; what a compiler would lower (and in what order) is not asked.
    tasks = run_extraction(
        request, environment=lambda: tophub_scope(request.target), call_order=None
    )
    return to_extracted_tasks(tasks, request.target, request.settings, module_equality)


def with_executor(mod: IRModule, executor: Any = None) -> IRModule:
    """Attach ``executor`` (the graph executor if None) as upstream's wrapper does, unless the
    module names one: the module's own executor wins."""
    if mod.get_attr("executor") is None:
        return mod.with_attr("executor", executor or relay.backend.Executor("graph"))
    return mod


@contextmanager
def tophub_scope(target: Target) -> Iterator[None]:
    """Upstream's wrapper loads TopHub configs for non-CUDA targets when nothing else is set.

    They decide AlterOpLayout's tiling on x86, so they must be in force here too.
    """
    from tvm import autotvm

    fallback = isinstance(autotvm.DispatchContext.current, autotvm.FallbackContext)
    if target.kind.name != "cuda" and fallback:
        with autotvm.tophub.context(target):
            yield
    else:
        yield


def to_extracted_tasks(
    tasks: Sequence[Task], target: Target, settings: PassSettings, module_equality: str
) -> list[tuple[Task, ms.ExtractedTask]]:
    """Convert shared tasks to ``ExtractedTask`` objects in upstream's order and naming.

    Each comes paired with the shared task it was made from.
    """
    converter_name = str(settings.config.get("relay.backend.tir_converter", "default"))
    with extraction_scope(target, settings):
        tir = {id(t): tir_module(t, converter_name) for t in tasks}
    for task in tasks:
        if tir[id(task)] is None:
            warn_skipped_dynamic(task, "MetaSchedule")
    occurrences = [t for _, t in sorted((v, t) for t in tasks for v in t.visits if tir[id(t)])]
    order = list(range(len(occurrences)))
    if module_equality == "anchor-block":
        # Fewer ops first, so that e.g. conv2d_add_relu (not conv2d_add_add_relu) names a task.
        counts = [_op_count(t.func) for t in occurrences]
        order = std_sort(order, lambda a, b: counts[a] < counts[b])
    database = ms.database.MemoryDatabase(module_equality=module_equality)
    firsts: list[tuple[ms.database.Workload, Task]] = []
    weights: list[int] = []
    committed: dict[int, ms.database.Workload] = {}
    for index in order:
        task = occurrences[index]
        # An occurrence of a task commits the same TIR module again: hashing it is the cost.
        if id(task) not in committed:
            committed[id(task)] = database.commit_workload(tir[id(task)])
        workload = committed[id(task)]
        hit = next((i for i, (wl, _) in enumerate(firsts) if wl.same_as(workload)), None)
        if hit is None:
            firsts.append((workload, task))
            weights.append(1)
        else:
            weights[hit] += 1
    names = NameSupply("")
    result = []
    for (_, task), weight in reversed(list(zip(firsts, weights, strict=True))):
        relay_mod = IRModule({tvm.ir.GlobalVar(task.name): task.func})
        name = names.fresh_name(task.name)
        extracted = ms.ExtractedTask(name, relay_mod, target, [tir[id(task)]], weight)
        result.append((task, extracted))
    return result


def tir_module(task: Task, converter_name: str = "default") -> IRModule | None:
    """The task's TE compute as the TIR module MetaSchedule tunes (None where declined).

    Runs the TIR converter upstream's PassContext names (``relay.backend.tir_converter``).
    """
    converter = tvm.get_global_func(f"relay.backend.tir_converter.{converter_name}", True)
    if converter is None:
        raise ModelError(
            f"unknown relay.backend.tir_converter {converter_name!r}; use 'default' or "
            "'allow_extern', or register relay.backend.tir_converter.<name> first"
        )
    constants = [data for _, data in task.lowered.constants]
    func = converter(task.lowered.tir_args(), constants)
    if func is None:  # the converter declines dynamic shapes and non-compute ops
        return None
    func = func.with_attr({"global_symbol": "main", "tir.noalias": True})
    return IRModule({tvm.ir.GlobalVar("main"): func})


def _op_count(func: relay.Function) -> int:
    count = 0

    def visit(node: Any) -> None:
        nonlocal count
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            count += 1

    relay.analysis.post_order_visit(func.body, visit)
    return count


def encode(task: TunerTask) -> dict[str, Any]:
    return source_data(task)


def decode(
    payload: dict[str, Any], target: Target, name: str, weight: int
) -> tuple[ms.ExtractedTask, Task]:
    """The task lowered here from its primitive function, as extraction lowers it."""
    func, constant_names = read_source(payload)
    settings = _settings(3, DEFAULT_PASS_CONFIG, None)
    with extraction_scope(target, settings), tophub_scope(target):
        source = lower_function(func, target, constant_names=constant_names)
        tir = tir_module(source)
    if tir is None:
        raise ValueError("its function has a dynamic shape, which MetaSchedule cannot tune")
    relay_mod = IRModule({tvm.ir.GlobalVar(source.name): source.func})
    return ms.ExtractedTask(name, relay_mod, target, [tir], weight), source


def merge(tasks: Sequence[TunerTask]) -> ms.ExtractedTask:
    first = tasks[0].native
    weight = sum(int(t.native.weight) for t in tasks)
    return ms.ExtractedTask(
        first.task_name, first.mod, first.target, list(first.dispatched), weight
    )


def tune(
    tasks: Sequence[TunerTask],
    target: Target,
    trials: int,
    work_dir: Path,
    runner: Runner,
    defaults: Mapping[str, float] = MappingProxyType({}),
    teachers: Callable[[], Sequence[Tuned]] = tuple,
) -> None:
    """``ms.tune_tasks`` into a JSON database in ``work_dir`` until it holds ``trials`` valid
    measurements, each round to the task whose part of the estimated latency it is likeliest to
    cut (:mod:`.allocation`; ``defaults`` are the default schedules' latencies, by
    ``alternatives_of``).

    Until the cost model has learnt from ``WARMUP`` measurements it scores candidates at
    random, and an evolutionary search on random scores is random sampling at many times the
    cost (on DCGAN 15-30 s of search a round of 10): random traces are replayed until then,
    then each task is searched with the model, its population sized by the measurements the
    allocation expects to give it. The cost model first learns the work dir's records of these
    tasks and of ``teachers()`` (tasks tuned for other models, here or in ``--reuse`` dirs);
    a task with no records yet starts from the best schedules of its nearest similar tasks
    (:func:`_starts`).
    """
    register_intrinsics(target)
    records = tally(read, work_dir, FILES)
    keys = [t.key for t in tasks]
    budget = trials - records.valid_for(keys)
    if budget <= 0:
        return
    full = filled(read, FILES, work_dir, keys, trials)
    session = _Session(tasks, _with_num_cores(target), work_dir, runner, full)
    allocation = Allocation(tasks, records, defaults)
    warm = min(budget, max(0, WARMUP - session.learn(teachers())))
    if warm:
        session.phase(allocation, warm, _round(warm, WARM_BATCH), _replay, records)
        records = tally(read, work_dir, FILES)
    left = trials - records.valid_for(keys)
    if left > 0:
        session.phase(allocation, left, _round(left, BATCH), _search, records)


#: The modules registering the tensor intrinsics that MetaSchedule's default schedule rules
#: look up by name, by target kind (hhb-tvm registers none itself: "TensorIntrin
#: 'dot_16x4_vnni' is not registered"). An LLVM target may be x86 or Arm. Importing all four
#: took 4.0 s of a tune's start, 3.0 of them CUDA's (TVMScript parsing 200 functions).
INTRINSICS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"llvm": ("x86", "arm_cpu"), "cuda": ("cuda",), "rocm": ("rocm",)}
)


def register_intrinsics(target: Target) -> None:
    """Register the tensor intrinsics the schedule rules for ``target`` may ask for (every
    module for a kind not in :data:`INTRINSICS`)."""
    everything = sorted({m for modules in INTRINSICS.values() for m in modules})
    for module in INTRINSICS.get(target.kind.name, everything):
        importlib.import_module(f"tvm.tir.tensor_intrin.{module}")


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
                 runner: Runner, full: Callable[[], bool]) -> None:  # fmt: skip
        self.tasks, self.target, self.work_dir, self.runner = tasks, target, work_dir, runner
        self.full = full
        self.loggers = ms.logging.get_loggers_from_work_dir(
            str(work_dir), [_file_part(t.name) for t in tasks]
        )
        self.seeds = ms.utils.fork_seed(None, n=len(tasks))
        self.database = WorkDatabase(work_dir, [t.native.dispatched[0] for t in tasks])
        self.cost_model = ms.cost_model.XGBModel(
            num_warmup_samples=WARMUP, num_tuning_cores=_physical_cores(), tree_method="auto"
        )
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
        starts = _starts([t for t in self.tasks if t.key not in measured], self.tutors)
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
            builder=_builder(self.runner),
            runner=_CommitEach(_runner(self.runner), scheduler, self.database, allocation),
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


def _starts(tasks: Sequence[TunerTask], tutors: Sequence[tuple[TunerTask, Any]]
            ) -> dict[str, list[Any]]:  # fmt: skip
    """By task key, the traces of the best records of each task's nearest similar tutors.

    Similar: the same fused operators, told by the name MetaSchedule gives a task less the
    number that tells shapes apart; nearest: :func:`.similar.nearest` over the shapes of its
    buffers; only tutors with valid records count. A trace of one shape replays on another,
    its tile sizes redrawn where they no longer divide, as MetaSchedule's own search replays
    them; one that does not replay is dropped where it is used (:class:`_StartingFrom`).
    """
    best: dict[str, list[Any]] = {}  # by tutor: the traces of its best records
    by_stem: dict[str, list[TunerTask]] = {}
    for tutor, memory in tutors:
        module = tutor.native.dispatched[0]
        if tutor.key in best or not memory.has_workload(module):
            continue
        top = memory.get_top_k(memory.commit_workload(module), STARTS_EACH)  # valid ones only
        traces = [r.trace for r in top]
        if traces:
            best[tutor.key] = traces
            by_stem.setdefault(stem(tutor.native.task_name), []).append(tutor)
    sizes: dict[str, Sizes] = {}  # by task key: estimating FLOPs walks the whole function
    for task in [*tasks, *(t for near in by_stem.values() for t in near)]:
        sizes.setdefault(task.key, _sizes(task))
    starts = {}
    for task in tasks:
        near = [(sizes[t.key], t) for t in by_stem.get(stem(task.native.task_name), [])
                if t.key != task.key]  # fmt: skip
        found = [trace for t in nearest(sizes[task.key], near) for trace in best[t.key]][:STARTS]
        if found:
            starts[task.key] = found
    return starts


def _sizes(task: TunerTask) -> Sizes:
    """The shapes of the buffers a task's function takes, in order (a dynamic extent as 1),
    and its FLOPs."""
    func = task.native.dispatched[0]["main"]
    shapes = [tuple(int(getattr(d, "value", 1)) for d in func.buffer_map[p].shape)
              for p in func.params]  # fmt: skip
    return shapes, flops(task.native)


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


def _task_records(scheduler: Any) -> Any:
    """The scheduler's task records (a derived scheduler answers attributes from its Python
    side, so they are asked of the TVM object itself)."""
    return tvm.runtime.Object.__getattr__(scheduler, "tasks_")


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
        for index, record in enumerate(_task_records(scheduler)):
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


#: Seconds between two looks at a batch's unfinished measurements.
POLL = 0.02


# TVM's derived_object replaces the class, which mutation tools cannot instrument.
@ms.derived_object
class _CommitEach(ms.runner.PyRunner):  # type: ignore[misc]  # pragma: no mutate block
    """Commits each measurement to the database, with a failure's cause, as it completes.

    MetaSchedule's task scheduler commits a batch only when it next picks that task, and in its
    first round only once every task has been measured: an interrupt lost all of that. This
    runner hands the scheduler futures that are already done, the records committed as
    MetaSchedule's own callback would commit them (a failure as 1e10 s). The batch being run is
    the task record whose builds are in and whose futures are not yet set.
    """

    def __init__(
        self, inner: Any, scheduler: Any, database: WorkDatabase, allocation: Allocation
    ) -> None:
        self.inner, self.scheduler, self.database = inner, scheduler, database
        self.allocation = allocation

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        index, task = next(
            (i, t)
            for i, t in enumerate(_task_records(self.scheduler))
            if t.builder_results is not None and t.runner_futures is None
        )
        workload = self.database.memory.commit_workload(task.ctx.mod)
        built = {}
        for candidate, result in zip(task.measure_candidates, task.builder_results, strict=True):
            if result.error_msg is None:
                built[str(result.artifact_path)] = candidate
            else:
                self._commit(task, workload, candidate, None, str(result.error_msg))
                self.allocation.measured(index, None)
        running: dict[int, Any] = {}
        results: list[Any] = [None] * len(runner_inputs)

        def commit_finished() -> None:
            for k in [k for k, future in running.items() if future.done()]:
                results[k] = result = running.pop(k).result()
                candidate = built[str(runner_inputs[k].artifact_path)]
                error = None if result.error_msg is None else str(result.error_msg)
                self._commit(task, workload, candidate, result.run_secs, error)
                self.allocation.measured(index, _seconds(result) if error is None else None)

        # One input a call: the local runner measures as it is called, an RPC runner returns
        # at once and measures on as many devices as the tracker lends.
        for i, runner_input in enumerate(runner_inputs):
            [running[i]] = self.inner.run([runner_input])
            commit_finished()
        while running:
            time.sleep(POLL)
            commit_finished()
        return [ms.runner.RunnerFuture(lambda: True, lambda r=r: r) for r in results]

    def _commit(self, task: Any, workload: Any, candidate: Any, run_secs: Any, error: str | None
                ) -> None:  # fmt: skip
        if error is not None or not run_secs:
            run_secs = [tvm.tir.FloatImm("float32", 1e10)]  # MetaSchedule's failure mark
        trace, info = candidate.sch.trace, candidate.args_info
        record = ms.database.TuningRecord(trace, workload, run_secs, task.ctx.target, info)
        self.database.commit(record, None if error is None else failure_cause(error))


def _seconds(result: Any) -> float | None:
    """A run's latency as the records give it (the mean of its repeats)."""
    secs = [float(s) for s in result.run_secs or ()]
    return sum(secs) / len(secs) if secs else None


def measurements(work_dir: Path) -> list[Measurement]:
    """The JSON database's records in commit order (its API sorts them by latency), each under
    its workload's structural hash, this adapter's task key, with the time it was measured;
    every trace checked (see :func:`.database.entries`) before anything lets MetaSchedule read
    the database."""
    if not (work_dir / RECORDS).exists():
        return []
    records = history(read, work_dir, FILES)
    times = read_times(work_dir, len(records))
    return [replace(m, at=at) for m, at in zip(records, times, strict=True)]


def flops(task: ms.ExtractedTask) -> float:
    return float(tvm.tir.analysis.estimate_tir_flops(task.dispatched[0]))


def build(
    mod: IRModule,
    target: Target,
    params: Any,
    work_dir: Path,
    tasks: Sequence[TunerTask],
    others: Sequence[TunerTask] = (),
) -> Any:
    """``compile_relay`` with the work dir's records of ``tasks``: each takes its best that
    computes what it computes; the other tasks (``others`` among them) get TVM's default
    schedules (:mod:`.untuned`)."""
    register_intrinsics(target)  # a record's trace may tensorize with one
    database = WorkDatabase(work_dir, [t.native.dispatched[0] for t in tasks], keep=CANDIDATES)
    memory, kept = _agreeing(database.memory, tasks, target)
    unchecked = [t for t in tasks if t not in kept]
    covered = covered_by(kept, [*others, *unchecked])
    asked = _Asked(memory)
    variants = variants_of([*tasks, *others])
    with untuned_as_without("relay.backend.use_meta_schedule", covered, variants):
        library = ms.relay_integration.compile_relay(asked, mod, target, params)
    warn_unused(kept, asked.applied, [*others, *unchecked])
    return library


@derived_object
class _Asked(ms.database.PyDatabase):  # type: ignore[misc]
    """A database that answers as ``inner`` does and notes the workloads the build found a
    record for (by :func:`.database.workload_key`)."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.applied: set[str] = set()

    def has_workload(self, mod: IRModule) -> bool:
        return bool(self.inner.has_workload(mod))

    def commit_workload(self, mod: IRModule) -> Any:
        return self.inner.commit_workload(mod)

    def commit_tuning_record(self, record: Any) -> None:
        self.inner.commit_tuning_record(record)

    def get_top_k(self, workload: Any, top_k: int) -> Any:
        return self.inner.get_top_k(workload, top_k)

    def get_all_tuning_records(self) -> Any:
        return self.inner.get_all_tuning_records()

    def query_tuning_record(self, mod: IRModule, target: Target, name: str) -> Any:
        record = self.inner.query_tuning_record(mod, target, name)
        if record is not None:
            self.applied.add(workload_key(record.workload.mod))
        return record

    def query_schedule(self, mod: IRModule, target: Target, name: str) -> Any:
        record = self.query_tuning_record(mod, target, name)
        return None if record is None else self.inner.query_schedule(mod, target, name)

    def query_ir_module(self, mod: IRModule, target: Target, name: str) -> Any:
        record = self.query_tuning_record(mod, target, name)
        return None if record is None else self.inner.query_ir_module(mod, target, name)

    def __len__(self) -> int:
        return len(self.inner)


def _agreeing(
    memory: Any, tasks: Sequence[TunerTask], target: Target
) -> tuple[Any, list[TunerTask]]:
    """A database of each task's best record that computes what the task computes
    (:mod:`.verify`), and the tasks that have one; ``memory`` as it is where this machine
    cannot run the target's code."""
    if not runs_here(target):
        return memory, list(tasks)
    checked = ms.database.MemoryDatabase()
    kept = []
    for task in tasks:
        module = task.native.dispatched[0]
        best = memory.get_top_k(memory.commit_workload(module), CANDIDATES)
        candidates = [(float(np.mean([float(s) for s in r.run_secs])), r) for r in best]
        record = best_agreeing(task.name, candidates, results(module, target), _scheduled, target)
        if record is not None:
            workload = checked.commit_workload(module)
            checked.commit_tuning_record(ms.database.TuningRecord(
                record.trace, workload, record.run_secs, record.target, record.args_info
            ))  # fmt: skip
            kept.append(task)
    return checked, kept


def _scheduled(record: Any) -> IRModule:
    schedule = tvm.tir.Schedule(record.workload.mod)
    record.trace.apply_to_schedule(schedule, remove_postproc=False)
    return schedule.mod


def _with_num_cores(target: Target) -> Target:
    """MetaSchedule's CPU rules need ``-num-cores``; default to this machine's cores."""
    import os

    if target.kind.name == "llvm" and "num-cores" not in target.attrs:
        return Target(f"{target} -num-cores {os.cpu_count() or 1}", target.host)
    return target


#: Seconds MetaSchedule's builder and local runner get for the check they make as they start
#: (a child process looks two functions up): a ``--timeout`` shorter than a loaded host takes
#: to answer it failed the whole tune ("TimeoutError in recv") instead of each measurement.
STARTUP_CHECK = 30.0


def _builder(runner: Runner) -> Any:
    """``--timeout`` bounds each build as it bounds each run."""
    builder = ms.builder.LocalBuilder(timeout_sec=max(runner.timeout, STARTUP_CHECK))
    builder.timeout_sec = runner.timeout  # each build's pool is made with it
    return builder


def _runner(runner: Runner) -> Any:
    if runner.tracker is None:
        local = ms.runner.LocalRunner(timeout_sec=max(runner.timeout, STARTUP_CHECK))
        local.timeout_sec = local.pool._timeout = runner.timeout  # each run's bound from here on
        return local
    host, port = runner.tracker
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=runner.key,
                                 session_timeout_sec=int(runner.timeout))  # fmt: skip
    remote = ms.runner.RPCRunner(config)
    # MetaSchedule's RPCRunner makes its pool without a timeout: a measurement on a device that
    # stopped answering (a server stopped, not gone: still registered) waited for ever, and the
    # tune with it. Bounded, it fails as a timeout, the tracker hands that server nothing more
    # (it never reports back free), and the tune goes on with the others.
    remote.pool._timeout = runner.timeout + SESSION_MARGIN
    return remote


#: The JSON database (workloads, a task's TIR a line, and records pointing into them) and the
#: failures' causes.
LOGS = (WORKLOADS, RECORDS, ERRORS, TIMES)


def adopt(tasks: Sequence[TunerTask], source: Path, work_dir: Path) -> int:
    """Copy the valid records of ``tasks`` from another work dir's database."""
    return WorkDatabase(work_dir, [t.native.dispatched[0] for t in tasks]).adopt(source)


def similar(tasks: Sequence[TunerTask], tuned: Callable[[], Sequence[Tuned]]) -> int:
    """How many of ``tasks`` have a similar task (:func:`_starts`) with valid records among
    ``tuned()``: those a tune starts from their schedules."""
    others = tuned()
    valid: dict[Path, set[str]] = {}
    for where in {t.work_dir for t in others}:
        valid[where] = {k for k, t in tally(read, where, FILES).tasks.items() if t.valid}
    stems = {stem(t.task.native.task_name) for t in others if t.task.key in valid[t.work_dir]}
    return sum(stem(t.native.task_name) in stems for t in tasks)


ADAPTER = Adapter(
    NAME,
    extract,
    encode,
    decode,
    key,
    merge,
    tune,
    measurements,
    flops,
    build,
    LOGS,
    adopt=adopt,
    similar=similar,
    files=FILES,
    read=read,
)
