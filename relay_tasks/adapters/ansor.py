"""Ansor (auto_scheduler): shared tasks -> ``SearchTask`` and weights, equal to upstream's.

Upstream compiles the model with the VM compiler under a ``TracingEnvironment``: every function
the compiler lowers is handed, by name, to ``auto_schedule_topi``, which records its workload
key; at the end the compiler reports how often each function was used (``op_weights``) and the
environment's weights are rebuilt from that report. The tasks come out in the order of that
report, which is the iteration order of the compiler's hash-map cache (keyed by a hash of the
labelled function and the target) copied through two TVM maps. This adapter hands the same
functions, under the same names, to the same ``auto_schedule_topi``, and replays the report in the
same order, so workload keys, descriptions, weights and order all come out equal.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import tvm
from tvm import auto_scheduler, relay, te, topi
from tvm.auto_scheduler import relay_integration as upstream
from tvm.auto_scheduler.relay_integration import TracingEnvironment, TracingMode
from tvm.auto_scheduler.workload_registry import register_workload_tensors
from tvm.contrib.popen_pool import PopenPoolExecutor
from tvm.target import Target

from ..errors import (
    ExtractionError,
    ModelError,
    TargetError,
    UsageError,
    describe_failure,
)
from ..inputs import ParamsLike, TargetLike
from ..ir import dunders_answered_in_python
from ..lowering.extract import (
    Task,
    display_name,
    in_call_order,
    lower_function,
    run_extraction,
    warn_skipped_dynamic,
)
from ..lowering.vm_cache import op_weights, storage_size_tasks, vm_function_names
from ..optimize.pipeline import PassSettings, extraction_scope
from ..request import Request
from .base import (
    SESSION_MARGIN,
    Adapter,
    Line,
    Measurement,
    RecordFiles,
    Runner,
    Tuned,
    TunerTask,
    cause_lines,
    damaged,
    failure_cause,
    record_lines,
)
from .functions import read_source, source_data
from .index import (
    SEED,
    Records,
    adopt_lines,
    as_tally,
    best_records,
    filled,
    history,
    records_of,
    tally,
)
from .journal import append
from .records import ansor_problem
from .similar import STARTS, Sizes, keep_fastest, nearest
from .untuned import covered_by, untuned_as_without, variants_of, warn_unused
from .verify import CANDIDATES, best_agreeing, results, runs_here

NAME = "ansor"
#: The records, one a line.
LOG = "ansor.json"
PASS_CONFIG = {"relay.backend.use_auto_scheduler": True}
#: Upstream extracts before the layout rewrite that tuning results would drive.
DISABLED_PASSES = frozenset({"AutoSchedulerLayoutRewrite"})


def extract_tasks(
    mod: Any,
    target: TargetLike,
    params: ParamsLike = None,
    *,
    target_host: TargetLike | None = None,
    hardware_params: Any = None,
    include_simple_tasks: bool = False,
    dump_workload_to_dag_log: str | None = None,
    opt_level: int = 3,
) -> tuple[list[auto_scheduler.SearchTask], list[int]]:
    """Extract Ansor search tasks and weights, equal to ``auto_scheduler.extract_tasks``.

    The arguments come in the order of every relay-tasks extractor, ``(mod, target, params)``;
    upstream's ``(mod, params, target)`` is what the drop-in (:mod:`relay_tasks.dropin`) takes.

    Parameters
    ----------
    mod : tvm.IRModule or tvm.relay.Function
        The model.
    target, target_host : str or tvm.target.Target
        The target (and host) to tune for.
    params : dict of str to numpy.ndarray or tvm.nd.NDArray, optional
        Weights bound into ``main`` by name.
    hardware_params : auto_scheduler.HardwareParams, optional
        Passed to every ``SearchTask``; required for CUDA targets on a machine without CUDA.
    include_simple_tasks : bool
        Also return tasks without a reduction (elementwise and layout functions).
    dump_workload_to_dag_log : str, optional
        Write the workload-key -> compute DAG map to this JSON file, as upstream does.
    opt_level : int
        The optimisation level.

    Returns
    -------
    tasks : list of auto_scheduler.SearchTask
    weights : list of int
    """
    if isinstance(target, (Mapping, tvm.ir.container.Map)):
        raise UsageError(
            "relay_tasks.ansor.extract_tasks takes (mod, target, params); these arguments are "
            "in upstream's order (mod, params, target), which auto_scheduler.extract_tasks takes "
            "with relay_tasks.install()"
        )
    request = _request(mod, target, params, target_host, opt_level)
    pairs = _extract(request, hardware_params, include_simple_tasks)
    tasks = [search for search, _, _ in pairs]
    if dump_workload_to_dag_log is not None:
        with open(dump_workload_to_dag_log, "w") as handle:
            json.dump({t.workload_key: str(t.compute_dag) for t in tasks}, handle)
    return tasks, [weight for _, weight, _ in pairs]


def extract(
    mod: Any, target: TargetLike, params: ParamsLike = None, **options: Any
) -> list[TunerTask]:
    """The registry's entry point (note: ``(mod, target, params)`` like every other tuner)."""
    allowed = {"target_host", "hardware_params", "include_simple_tasks", "opt_level"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ModelError(f"unknown Ansor option(s): {', '.join(unknown)}")
    request = _request(mod, target, params, options.get("target_host"), options.get("opt_level", 3))
    pairs = _extract(
        request,
        options.get("hardware_params") or default_hardware_params(request.target),
        bool(options.get("include_simple_tasks", False)),
    )
    return [
        # The description joins names from a set (process-dependent order); sorted for display.
        TunerTask(
            ",".join(sorted(search.desc.split(","))),
            weight,
            source.anchor_op,
            key(search),
            search,
            source=source,
        )
        for search, weight, source in pairs
    ]


def key(task: auto_scheduler.SearchTask) -> str:
    """The workload key (hash of the compute DAG and shapes) is Ansor's identity of a task."""
    return hashlib.sha256(task.workload_key.encode()).hexdigest()[:16]


def encode(task: TunerTask) -> dict[str, Any]:
    return source_data(task)


def decode(
    payload: dict[str, Any], target: Target, name: str, weight: int
) -> tuple[auto_scheduler.SearchTask, Task]:
    """The search task of the compute its function lowers to here (its key: that compute's)."""
    func, constant_names = read_source(payload)
    with extraction_scope(target, PassSettings(3, PASS_CONFIG, DISABLED_PASSES)):
        source = lower_function(func, target, constant_names=constant_names)
        tensors = upstream.traverse_to_get_io_tensors(_schedulable_outputs(source))[0]
    if not tensors:
        raise ValueError("its function has a dynamic shape, which Ansor cannot tune")
    workload_key = auto_scheduler.ComputeDAG(tensors).workload_key()
    register_workload_tensors(workload_key, tensors)
    search = _search_task(
        workload_key=workload_key,
        target=target,
        hardware_params=default_hardware_params(target),
        layout_rewrite_option=auto_scheduler.LayoutRewriteOption.get_target_default(target, True),
        desc=name,
    )
    return search, source


def merge(tasks: Sequence[TunerTask]) -> auto_scheduler.SearchTask:
    return tasks[0].native


def tune(
    tasks: Sequence[TunerTask],
    target: Target,
    trials: int,
    work_dir: Path,
    runner: Runner,
    defaults: Mapping[str, float] = MappingProxyType({}),
    teachers: Callable[[], Sequence[Tuned]] = tuple,
) -> None:
    """Ansor's task scheduler (gradient, by weight) until the log holds ``trials`` valid
    measurements, starting from the default schedules' latencies (``defaults``, by
    ``alternatives_of``; see :class:`_FromDefaults`); the search effort scales down with the
    budget. Its cost model first learns the records of these tasks and of ``teachers()``
    (tasks tuned for other models, here or in ``--reuse`` dirs), and a task with no records
    starts from the best states of its nearest similar tasks (:class:`_Tutors`)."""
    records = tally(read, work_dir, FILES)
    budget = trials - records.valid_for(t.key for t in tasks)
    if budget <= 0:
        return
    natives = [_measurable(t.native) for t in tasks]
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
                builder=auto_scheduler.LocalBuilder(timeout=_seconds(runner)),  # --timeout too
                runner=_runner(runner),
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
        for record in _records(work_dir / LOG, [line for line, _ in chosen]):
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


def _measurable(task: auto_scheduler.SearchTask) -> auto_scheduler.SearchTask:
    """The task as Ansor can measure it: where its layout rewrite fails on every schedule, the
    same task without the rewrite (the extraction keeps upstream's option; only the tuning
    drops it, and :func:`build` applies such records without rewriting the weights)."""
    if task.layout_rewrite_option == _NO_REWRITE or not _rewrite_fails(task.compute_dag):
        return task
    state = task.__getstate__()
    state["layout_rewrite_option"] = _NO_REWRITE
    copy: auto_scheduler.SearchTask = auto_scheduler.SearchTask.__new__(auto_scheduler.SearchTask)
    copy.__setstate__(state)
    return copy


_NO_REWRITE = auto_scheduler.LayoutRewriteOption.NO_REWRITE


def _rewrite_fails(dag: auto_scheduler.ComputeDAG) -> bool:
    """Whether Ansor's layout rewrite of the weights fails on this compute, shown on its
    simplest schedule (one split of the weight reader's first axis): on this TVM build it
    fails on every schedule of ``nn.dense`` (its index rewriter finds no index for an axis of
    the rewritten layout), so upstream's tune of a BERT measured no valid dense schedule."""
    state = dag.get_init_state()
    reader = next((op for op in dag.ops if isinstance(op, te.ComputeOp)
                   and "layout_free_placeholders" in op.attrs), None)  # fmt: skip
    if reader is None:
        return False
    state.split(reader, state[reader].iters[0], [1])
    try:
        dag.rewrite_layout_from_state(state)
    except tvm.TVMError:
        return True
    return False


class _BestWithoutFailingRewrites(auto_scheduler.ApplyHistoryBest):  # type: ignore[misc]
    """The log's best states, kept from the build's layout-rewrite pass for the workloads
    whose rewrite fails (:func:`_rewrite_fails`): the pass then leaves their weights as they
    are, and the build applies their states, tuned without the rewrite, to the plain compute."""

    def __init__(self, log: str, unrewritable: frozenset[str]) -> None:
        super().__init__(log)
        self.unrewritable = unrewritable
        #: The workload keys a state was found for: the records the build applied.
        self.applied: set[str] = set()

    def _query_inside(self, target: Any, workload_key: str, func_name: str) -> Any:
        env = TracingEnvironment.current
        if (
            env is not None
            and env.tracing_mode == TracingMode.PREPARE_LAYOUT_REWRITE
            and workload_key in self.unrewritable
        ):
            return None
        state = super()._query_inside(target, workload_key, func_name)
        if state is not None:
            self.applied.add(workload_key)
        return state


#: Measurements of a task, none valid, after which it is left (a tiny task's sketches can fail
#: a few times before one builds; a BERT's dense layers failed 241 times in a row).
FAILED_MEASUREMENTS = 32


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
        before :func:`_measurable`, took all 210 measurements of a tune of 64. Once the work
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
            if not _failed(res):
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


#: The causes of failed measurements, one a line (Ansor's log keeps only an error code).
ERRORS_FILE = "ansor_errors.jsonl"
FILES = RecordFiles(LOG, ERRORS_FILE)


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
        causes = [failure_cause(str(res.error_msg)) for res in results if _failed(res)]
        append(self.work_dir, [(LOG, records), (ERRORS_FILE, cause_lines(causes))])


def _failed(result: Any) -> bool:
    return int(result.error_no) != 0 or not list(result.costs)


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


def read(work_dir: Path, lines: Iterable[Line]) -> Iterator[Measurement]:
    codes = {int(v): k for k, v in vars(auto_scheduler.measure.MeasureErrorNo).items()
             if isinstance(v, int)}  # fmt: skip
    for record in _records(work_dir / LOG, lines):
        failed = record.seconds is None
        name = codes.get(record.error_no, f"error {record.error_no}") if failed else ""
        yield Measurement(record.key, record.seconds, name, record.at)


def measurements(work_dir: Path) -> list[Measurement]:
    return history(read, work_dir, FILES)


class _Record(NamedTuple):
    """One line of an Ansor log as read here: its task key, mean latency (None if it failed)
    and when; ``inp`` and ``res`` are Ansor's own reading of it."""

    key: str
    seconds: float | None
    error_no: int
    at: float
    inp: Any
    res: Any


def _records(log: Path, lines: Iterable[Line]) -> Iterator[_Record]:
    """The records of ``log``, each checked against the allowlist of steps before Ansor's
    reader sees it (:func:`.records.ansor_problem`); one that is not a record is one error
    naming the file and the line."""
    for number, _, line, value, _ in lines:
        try:
            task, (_, steps) = value["i"]  # {"i": [task, [stages, steps]], "r": ...}
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise damaged(log, number, f"not an Ansor record ({type(err).__name__})") from err
        problem = ansor_problem(task, steps)
        if problem:
            raise damaged(log, number, problem)
        try:
            inp, res = auto_scheduler.measure_record.load_record_from_string(line)
            task_key = key(inp.task)
            costs = [float(c) for c in res.costs]
            error_no = int(res.error_no)
        except Exception as err:  # TVM's record reader raises TVMError on what it cannot read
            raise damaged(log, number, describe_failure(err)) from err
        seconds = sum(costs) / len(costs) if error_no == 0 and costs else None
        yield _Record(task_key, seconds, error_no, float(res.timestamp), inp, res)


def flops(task: auto_scheduler.SearchTask) -> float:
    """Ansor's count, or TIR's estimate where Ansor's counter gives up and says -1 (on a
    ``select``, which global average pooling's divisor holds): a negative count would be shown
    as such and divide by zero where similar tasks are told apart by their FLOPs."""
    counted = float(task.compute_dag.flop_ct)
    if counted >= 0:
        return counted
    func = te.create_prim_func(list(task.compute_dag.tensors))
    return float(tvm.tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))


def build(
    mod: Any,
    target: Target,
    params: Any,
    work_dir: Path,
    tasks: Sequence[TunerTask],
    others: Sequence[TunerTask] = (),
) -> Any:
    """``relay.build`` with the log's best states of ``tasks`` applied, as upstream's tutorial
    builds; the other tasks (``others`` among them) get TVM's default schedules
    (:mod:`.untuned`)."""
    unrewritable = frozenset(
        t.native.workload_key for t in tasks if _rewrite_fails(t.native.compute_dag)
    )
    kept = list(tasks)
    with records_of(read, FILES, tasks, work_dir, CANDIDATES) as log:
        if runs_here(target):
            chosen = _agreeing(log, tasks, target, unrewritable)
            log.write_text("".join(line for _, line in chosen))
            kept = [task for task, _ in chosen]
        records = _BestWithoutFailingRewrites(str(log), unrewritable)
    covered, variants = covered_by(tasks, others), variants_of([*tasks, *others])
    untuned = untuned_as_without("relay.backend.use_auto_scheduler", covered, variants)
    context = tvm.transform.PassContext(opt_level=3, config=PASS_CONFIG)
    with untuned, _quiet_fallback(), records, context:
        library = relay.build(mod, target=target, params=params)
    applied = {t.key for t in kept if t.native.workload_key in records.applied}
    warn_unused(kept, applied, [*others, *(t for t in tasks if t not in kept)])
    return library


def _agreeing(
    log: Path, tasks: Sequence[TunerTask], target: Target, unrewritable: frozenset[str]
) -> list[tuple[TunerTask, str]]:
    """Of ``log``'s lines, each task's best valid one whose state computes what the task
    computes (:mod:`.verify`), checked with the weights' layout rewritten inside the kernel,
    as measured (or left, where the rewrite fails: :func:`_rewrite_fails`)."""
    by_workload: dict[str, list[tuple[float, tuple[str, Any]]]] = {}
    for _, line in record_lines(log):
        inp, res = auto_scheduler.measure_record.load_record_from_string(line)
        if int(res.error_no) == 0 and len(res.costs):
            cost = sum(float(c) for c in res.costs) / len(res.costs)
            by_workload.setdefault(inp.task.workload_key, []).append((cost, (line, inp.state)))
    kept = []
    for task in tasks:
        dag, workload = task.native.compute_dag, task.native.workload_key
        candidates = by_workload.get(workload, [])
        if not candidates:
            continue
        rewrite = (auto_scheduler.LayoutRewriteOption.NO_REWRITE if workload in unrewritable
                   else auto_scheduler.LayoutRewriteOption.INSERT_TRANSFORM_STAGE)  # fmt: skip

        def scheduled(record: tuple[str, Any], dag: Any = dag, rewrite: Any = rewrite) -> Any:
            return _lowered(dag, record[1], rewrite)

        expected = results(_lowered(dag, dag.get_init_state()), target)
        chosen = best_agreeing(task.name, candidates, expected, scheduled, target)
        if chosen is not None:
            kept.append((task, chosen[0] + "\n"))
    return kept


def _lowered(
    dag: Any, state: Any, rewrite: Any = auto_scheduler.LayoutRewriteOption.NO_REWRITE
) -> tvm.IRModule:
    """``state`` applied to ``dag``, lowered to a TIR module of one ``main``."""
    schedule, args = dag.apply_steps_from_state(state, layout_rewrite=rewrite)
    return tvm.lower(schedule, args, name="main")


@contextmanager
def _quiet_fallback() -> Iterator[None]:
    """Ansor's fallback context prints a compute DAG for each complex function without a
    record: ``compile`` names those tasks in one line already."""
    fallback = auto_scheduler.DispatchContext.current
    verbose, fallback.verbose = fallback.verbose, 0
    try:
        yield
    finally:
        fallback.verbose = verbose


def _runner(runner: Runner) -> Any:
    if runner.tracker is None:
        return auto_scheduler.LocalRunner(repeat=1, timeout=_seconds(runner))
    host, port = runner.tracker
    _BoundedPool.bound = _seconds(runner) + SESSION_MARGIN
    auto_scheduler.measure.PopenPoolExecutor = _BoundedPool
    # Ansor's runner first asks the tracker for a device in a session of its own, with no
    # timeout: handed a server that stopped answering, it waited for ever before the first
    # measurement. The supervisor has asked the tracker already (.tuning.device.check_tracker).
    auto_scheduler.measure.check_remote = lambda *args, **kwargs: True
    return auto_scheduler.RPCRunner(runner.key, host, port, repeat=1, timeout=_seconds(runner))


class _BoundedPool(PopenPoolExecutor):  # type: ignore[misc]
    """Ansor's RPC runner makes its pool without a timeout: a measurement on a device that
    stopped answering (its server stopped, not gone: still registered) waited for ever, and the
    tune with it. A pool made without one gets :attr:`bound`: the measurement fails as a run
    timeout, the tracker hands that server nothing more (it never reports back free), and the
    tune goes on with the others. Pools made with a timeout (the builder's) keep theirs."""

    bound: float | None = None

    def __init__(self, max_workers: int | None = None, timeout: float | None = None,
                 *args: Any, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(max_workers, self.bound if timeout is None else timeout, *args, **kwargs)


def _seconds(runner: Runner) -> int:
    """Ansor takes whole seconds; a fraction of one rounds up, never to no time at all."""
    return max(1, math.ceil(runner.timeout))


def similar(tasks: Sequence[TunerTask], tuned: Callable[[], Sequence[Tuned]]) -> int:
    """How many of ``tasks`` a tune starts from the states of similar tasks among ``tuned()``."""
    tutors = _Tutors.of(tuned())
    return sum(bool(tutors.starts(t.native)) for t in tasks)


ADAPTER = Adapter(
    NAME, extract, encode, decode, key, merge, tune, measurements, flops, build,
    (LOG, ERRORS_FILE),
    adopt=lambda tasks, source, work_dir: adopt_lines(read, FILES, tasks, source, work_dir),
    similar=similar,
    files=FILES,
    read=read,
)  # fmt: skip


def default_hardware_params(target: Target) -> Any:
    """Hardware parameters for targets this machine cannot be asked about (CUDA without a GPU).

    Upstream's ``SearchTask`` asks the CUDA runtime for the shared memory, threads per block and
    warp size, which this TVM build cannot; they shape the search, not which tasks exist. Here
    they come from the target (``-max_shared_memory_per_block``, ``-max_num_threads``,
    ``-thread_warp_size``; 48 KiB shared memory unless given), the rest by upstream's rule.
    """
    if target.kind.name != "cuda":
        return None
    warp_size = int(target.attrs.get("thread_warp_size", 32))
    return auto_scheduler.HardwareParams(
        num_cores=-1,
        vector_unit_bytes=16,
        cache_line_bytes=64,
        max_shared_memory_per_block=int(target.attrs.get("max_shared_memory_per_block", 49152)),
        max_local_memory_per_block=2**31 - 1,  # CUDA sets no limit: upstream disables the check
        max_threads_per_block=int(target.attrs.get("max_num_threads", 1024)),
        max_vthread_extent=warp_size // 4,
        warp_size=warp_size,
    )


def _request(
    mod: Any,
    target: TargetLike,
    params: ParamsLike,
    target_host: TargetLike | None,
    opt_level: int,
) -> Request:
    settings = PassSettings(opt_level, PASS_CONFIG, DISABLED_PASSES)
    return Request.of(mod, target, params, settings, target_host=target_host)


def _extract(
    request: Request, hardware_params: Any, include_simple_tasks: bool
) -> list[tuple[auto_scheduler.SearchTask, int, Task]]:
    tgt = request.target
    tasks = run_extraction(request)
    lowered_in_order = in_call_order(tasks)
    # The compiler lowers in batches: the model's functions, then the storage-size functions its
    # memory planning adds for dynamic shapes.
    batches = [lowered_in_order, storage_size_tasks(lowered_in_order, tgt, request.settings)]
    lowered = [task for batch in batches for task in batch]
    names = vm_function_names(lowered)
    mode = (
        TracingMode.EXTRACT_TASK if include_simple_tasks else TracingMode.EXTRACT_COMPLEX_TASK_ONLY
    )
    env = TracingEnvironment(mode)
    with _tracing(env, tgt):
        for name, task in zip(names, lowered, strict=True):
            _trace(name, task)
        upstream.te_compiler_update_weights(op_weights(batches, names, tgt))
    by_name = dict(zip(names, lowered, strict=True))
    result = []
    for workload_key, (weight, func_names) in env.wkl_key_to_weight.items():
        search = _search_task(
            workload_key=workload_key,
            target=tgt,
            hardware_params=hardware_params,
            layout_rewrite_option=auto_scheduler.LayoutRewriteOption.get_target_default(tgt, True),
            task_inputs=env.wkl_key_to_input_names.get(workload_key),
            task_inputs_save_to_file=True,
            desc=",".join(func_names),
        )
        source = by_name[min(func_names, key=names.index)]
        result.append((search, int(weight), source))
    return result


def _trace(name: str, task: Task) -> None:
    """Hand one lowered function to Ansor's tracing, as the compiler does."""
    outputs = _schedulable_outputs(task)
    try:
        # Upstream's own rule: a task needs static shapes on the tensors its compute reads
        # and writes (a shape_of reads no tensor, so a dynamic input does not count).
        static = upstream.traverse_to_get_io_tensors(outputs)[0]
    except tvm.TVMError as err:  # a shape that reads a tensor (data-dependent): TVM gives up
        raise ExtractionError(
            f"Ansor cannot read the shapes of {display_name(task)} "
            f"({describe_failure(err)}); upstream's extraction fails here too: give the model "
            "static input shapes"
        ) from err
    if not static:
        warn_skipped_dynamic(task, "Ansor")
    elif _computes_only(outputs):
        upstream.auto_schedule_topi(name, outputs)


def _computes_only(outputs: Sequence[te.Tensor]) -> bool:
    """Whether Ansor's ``ComputeDAG`` can take what computes ``outputs``: compute ops down to
    placeholders, nothing else. Its hook would fail on anything else and give no task, as it
    does, but only after raising a TVM error, whose first backtrace in a process costs 0.17 s
    (x86's concatenate of static shapes is an extern op: the Llama decoder's one was half of
    its Ansor extraction)."""
    seen: set[int] = set()
    stack = [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op.handle.value in seen or isinstance(op, te.PlaceholderOp):
            continue
        if not isinstance(op, te.ComputeOp):
            return False
        seen.add(op.handle.value)
        stack += [t.op for t in op.input_tensors]
    return True


def _search_task(**kwargs: Any) -> auto_scheduler.SearchTask:
    try:
        # The workload's compute is built again, numpy probes included (see the pipeline's
        # dunders_answered_in_python).
        with dunders_answered_in_python():
            return auto_scheduler.SearchTask(**kwargs)
    except tvm.TVMError as err:
        if "device_api" in str(err) and kwargs.get("hardware_params") is None:
            raise TargetError(
                f"Ansor needs hardware_params for {kwargs['target'].kind.name} on this machine "
                "(no runtime to ask): pass hardware_params=auto_scheduler.HardwareParams(...)"
            ) from err
        raise


@contextmanager
def _tracing(env: TracingEnvironment, target: Target) -> Iterator[None]:
    from tvm import autotvm

    dispatch = auto_scheduler.DispatchContext.current
    verbose, silent = dispatch.verbose, autotvm.GLOBAL_SCOPE.silent
    dispatch.verbose, autotvm.GLOBAL_SCOPE.silent = 0, True
    try:
        with env, target:
            yield
    finally:
        dispatch.verbose, autotvm.GLOBAL_SCOPE.silent = verbose, silent


def _schedulable_outputs(task: Task) -> list[te.Tensor]:
    """The outputs the compiler schedules: an output that is just an input gets copied."""
    return [topi.identity(t) if isinstance(t.op, te.PlaceholderOp) else t for t in task.outputs]
