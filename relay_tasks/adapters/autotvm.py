"""AutoTVM: shared tasks -> ``tvm.autotvm.task.Task``, equal to ``extract_from_program``.

Upstream lowers the whole model with the VM compiler under AutoTVM's ``TaskExtractEnv``, which
records a template (name and arguments) every time an AutoTVM-registered TOPI compute runs. The
shared backend runs the very same computes when it lowers each distinct function to TE, so here
that environment is on while the backend works; what each function records is kept apart and put
together again in the order the VM compiler would have lowered the functions (call order).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import tvm
from tvm import autotvm
from tvm.autotvm.task import TaskExtractEnv
from tvm.autotvm.task.dispatcher import ApplyConfig, DispatchContext, FallbackContext
from tvm.autotvm.task.space import ConfigSpace, FallbackConfigEntity, SplitEntity
from tvm.autotvm.task.task import compute_flop, serialize_args
from tvm.target import Target

from ..errors import ModelError, describe_failure
from ..inputs import ParamsLike, TargetLike
from ..ir import dunders_answered_in_python
from ..lowering.extract import (
    Task,
    display_name,
    in_call_order,
    lower_function,
    run_extraction,
    shape_text,
)
from ..optimize.pipeline import PassSettings, extraction_scope
from ..request import Request
from .allocation import Allocation, apportion
from .base import (
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
from .functions import only_fields, read_dtype, read_shape, read_source, source_data
from .index import SEED, adopt_lines, best_records, filled, history, records_of, tally
from .journal import append
from .records import autotvm_problem
from .similar import STARTS, Sizes, apart, keep_fastest, nearest
from .untuned import warn_unused
from .verify import CANDIDATES, best_agreeing, results, runs_here

NAME = "autotvm"
#: The records, one a line.
LOG = "autotvm.log"
#: Upstream's extraction lowers with AlterOpLayout off: AutoTVM's templates expect that.
DISABLED_PASSES = frozenset({"AlterOpLayout"})


def extract_tasks(
    mod: Any,
    target: TargetLike,
    params: ParamsLike = None,
    *,
    ops: Sequence[Any] | None = None,
    opt_level: int = 3,
    target_host: TargetLike | None = None,
) -> list[autotvm.task.Task]:
    """Extract AutoTVM tasks, equal to ``autotvm.task.extract_from_program``.

    Parameters
    ----------
    mod : tvm.IRModule or tvm.relay.Function
        The model.
    target : str or tvm.target.Target
        The target to tune for.
    params : dict of str to numpy.ndarray or tvm.nd.NDArray, optional
        Weights bound into ``main`` by name.
    ops : list of tvm.ir.Op, optional
        Only record templates of these Relay ops (upstream's ``ops``).
    opt_level : int
        The optimisation level.
    target_host : str or tvm.target.Target, optional
        The host target, as upstream takes it.

    Returns
    -------
    list of tvm.autotvm.task.Task
    """
    request = _request(mod, target, params, opt_level, target_host)
    return [task for _, task in _extract([request], ops)]


def extract_tasks_from_models(
    mods: Sequence[Any],
    target: TargetLike,
    params: Sequence[ParamsLike] | None = None,
    *,
    ops: Sequence[Any] | None = None,
    opt_level: int = 3,
    target_host: TargetLike | None = None,
) -> list[autotvm.task.Task]:
    """Several models at once, equal to ``autotvm.task.extract_from_multiple_program`` (which
    takes ``mods, params, target``; here the house order, ``params[i]`` for ``mods[i]``)."""
    requests: list[Request] = []
    for mod, weights in zip(mods, [None] * len(mods) if params is None else params, strict=True):
        if requests:  # the target and settings are checked once, for the first model
            requests.append(requests[0].with_model(mod, weights))
        else:
            requests.append(_request(mod, target, weights, opt_level, target_host))
    return [task for _, task in _extract(requests, ops)]


def extract(
    mod: Any, target: TargetLike, params: ParamsLike = None, **options: Any
) -> list[TunerTask]:
    """The registry's entry point: :func:`extract_tasks` as :class:`TunerTask` rows."""
    allowed = {"ops", "opt_level", "target_host"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ModelError(f"unknown AutoTVM option(s): {', '.join(unknown)}")
    request = _request(mod, target, params, options.get("opt_level", 3), options.get("target_host"))
    pairs = _extract([request], options.get("ops"))
    return [
        TunerTask(
            task.name,
            weight,
            source.anchor_op if source else "",
            key(task),
            task,
            group=source.key if source else "",
            source=source,
        )
        for (source, task), weight in zip(pairs, _weights(pairs), strict=True)
    ]


def _weights(pairs: list[tuple[Task | None, autotvm.task.Task]]) -> list[int]:
    # AutoTVM tasks carry no weight; the neutral weight of the function that first needed the
    # template is the closest meaningful figure for a table.
    return [source.weight if source else 1 for source, _ in pairs]


def _request(
    mod: Any,
    target: TargetLike,
    params: ParamsLike,
    opt_level: int,
    target_host: TargetLike | None,
) -> Request:
    settings = PassSettings(opt_level, {}, DISABLED_PASSES)
    return Request.of(mod, target, params, settings, target_host=target_host)


def _extract(
    requests: Sequence[Request], ops: Sequence[Any] | None
) -> list[tuple[Task | None, autotvm.task.Task]]:
    env = TaskExtractEnv.get()
    env.reset(list(ops) if ops is not None else None)
    records: list[tuple[Task | None, tuple[str, Any]]] = []
    for request in requests:
        before_lowering: list[tuple[str, Any]] = []
        tasks = run_extraction(
            request,
            environment=functools.partial(_tracing, env, before_lowering),
            lowering_scope=lambda: _per_function(env),
        )
        records += [(None, r) for r in before_lowering]
        lowered_in_order = in_call_order(tasks)
        records += [(t, record) for t in lowered_in_order for record in t.traced]
    result: list[tuple[Task | None, autotvm.task.Task]] = []
    seen: set[tuple[str, Any]] = set()
    tgt = requests[0].target if requests else None  # one target: with_model keeps it
    for source, (name, args) in records:
        if (name, args) in seen:
            continue
        seen.add((name, args))
        try:
            result.append((source, create_task(name, args, tgt)))
        except _invalid_shape_error():
            continue  # upstream drops these too (with a warning)
        except Exception as err:
            shape = _dynamic_tensor_shape(args)
            if shape is None:
                raise
            of = f" of {display_name(source)}" if source else ""
            raise ModelError(
                f"AutoTVM cannot make a {name} task{of}: its shape {shape} is dynamic "
                "(upstream's extraction fails here too); give the model static input shapes, or "
                "use MetaSchedule, which leaves dynamic functions out"
            ) from err
    return result


def create_task(name: str, args: Any, target: Target) -> autotvm.task.Task:
    """``autotvm.task.create``, less its probe for a ``code_hash`` the schedule never has.

    Upstream asks the TVM object for the attribute, which fails in C++; the first TVM error of
    a process loads the symbols for its backtrace, 0.15 s that made up two thirds of extracting
    a one-operator model. The task is otherwise built as upstream builds it (tested field by
    field): the template run once under its empty config space records the space and FLOPs.
    """
    task = autotvm.task.Task(name, serialize_args(args))
    task.config_space = ConfigSpace()
    # The template builds its compute again, numpy probes included (see the pipeline's
    # dunders_answered_in_python).
    with ApplyConfig(task.config_space), target, dunders_answered_in_python():
        schedule, _ = task.func(*task.args)
    # Set in Python by autotvm.task.attach_code_hash, when a template asks for it.
    task.config_space.code_hash = vars(schedule).get("code_hash")
    task.flop = task.config_space.flop or compute_flop(schedule)
    task.target, task.target_host = target, target.host
    return task


def _dynamic_tensor_shape(args: Any) -> str | None:
    """The first tensor shape in a template's arguments with a run-time dimension, as
    ``(?, 16)``; None when all are static. (Templates traced by layout hooks during the passes
    have no function to name, so the arguments are what there is.)"""
    shapes = (shape_text(tensor[1]) for tensor in _tensor_args(args))
    return next((shape for shape in shapes if shape is not None), None)


def _tensor_args(args: Any) -> Iterator[tuple[Any, ...]]:
    """A template's tensor arguments, ``("TENSOR", shape, dtype)`` each."""
    return (arg for arg in args if isinstance(arg, tuple) and arg[:1] == ("TENSOR",))


def _invalid_shape_error() -> type[Exception]:
    from tvm import topi

    return topi.InvalidShapeError  # type: ignore[no-any-return]


@contextmanager
def _tracing(env: TaskExtractEnv, before_lowering: list[tuple[str, Any]]) -> Iterator[None]:
    """Upstream's environment: tracing on, fallback configs forgotten afterwards."""
    with env:
        try:
            yield
        finally:
            before_lowering.extend(_unlowered(env))
    if isinstance(DispatchContext.current, FallbackContext):
        DispatchContext.current.memory = {}
        DispatchContext.warning_messages = set()


def _unlowered(env: TaskExtractEnv) -> list[tuple[str, Any]]:
    # What passes (not the lowering) recorded stays in the shared collection.
    return list(env.task_collection)


@contextmanager
def _per_function(env: TaskExtractEnv) -> Iterator[list[Any]]:
    """Record what lowering one function traces, apart from every other function."""
    saved = env.task_collection
    env.task_collection = []
    record: list[Any] = []
    try:
        yield record
    finally:
        record.extend(env.task_collection)
        env.task_collection = saved


def key(task: autotvm.task.Task) -> str:
    """A template and its arguments are the tuning problem, whichever model they come from."""
    digest = hashlib.sha256(repr((task.name, task.args)).encode()).hexdigest()
    return digest[:16]


def encode(task: TunerTask) -> dict[str, Any]:
    template = {"template": task.native.name}
    if task.source is None:  # traced while a pass ran, not while a function was lowered
        return {**template, "args": _jsonable(task.native.args)}
    return {**template, **source_data(task)}


def decode(
    payload: dict[str, Any], target: Target, name: str, weight: int
) -> tuple[autotvm.task.Task, Task | None]:
    """The template its function's lowering traces here (or, for a task no function traced,
    a registered template with arguments of plain values only)."""
    template = payload.get("template")
    if not isinstance(template, str) or template not in autotvm.task.task.TASK_TABLE:
        raise ValueError(f"{template!r} is not a registered AutoTVM template")
    if "function" not in payload:
        only_fields(payload, {"template", "args"})
        return create_task(template, checked_args(payload.get("args")), target), None
    func, constant_names = read_source(payload, also=frozenset({"template"}))
    env = TaskExtractEnv.get()
    env.reset(None)
    with extraction_scope(target, PassSettings(3, {}, DISABLED_PASSES)), _tracing(env, []):
        source = lower_function(
            func, target, constant_names=constant_names, lowering_scope=lambda: _per_function(env)
        )
    for traced, args in source.traced:
        if traced == template:
            return create_task(traced, args, target), source
    raise ValueError(f"its function does not use the template {template}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def checked_args(value: Any, depth: int = 0) -> Any:
    """A template's arguments from a file: tensors (``["TENSOR", shape, dtype]``), numbers,
    short names and lists of them, as tuples (AutoTVM serialises arguments so), bounded."""
    if depth > 4:
        raise ValueError("template arguments nest too deeply")
    if value is None or type(value) in (bool, int, float):
        return value
    if isinstance(value, str):
        if not ARG_TEXT.match(value):
            raise ValueError(f"{value[:40]!r} is not a template argument")
        return value
    if isinstance(value, list) and value[:1] == ["TENSOR"] and len(value) == 3:
        return ("TENSOR", tuple(read_shape(value[1])), read_dtype(value[2]))
    if isinstance(value, list) and len(value) <= 64:
        return tuple(checked_args(v, depth + 1) for v in value)
    raise ValueError("template arguments are tensors, numbers, names and lists of them")


#: Layouts, dtypes and modes, as TOPI's templates take them.
ARG_TEXT = re.compile(r"[A-Za-z0-9_]{0,64}\Z")


def merge(tasks: Sequence[TunerTask]) -> autotvm.task.Task:
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
    """XGBTuner per task, until the log holds ``trials`` valid measurements in all, each task's
    share of them by its part of the latency known (``defaults``, the default schedules'
    latencies, and the records; see :func:`allotments`). A task's tuner learns its records,
    and a task with none first measures the best configs of its nearest similar tasks among
    these and ``teachers()`` (tasks tuned for other models, here or in ``--reuse`` dirs; see
    :class:`_Tutors`). A failed measurement does not count, so a rerun retries it."""
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
    with _measure_option(runner) as measure:
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
                callbacks=[_keep(work_dir), tutors.learn],
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
        for record in _records(work_dir / LOG, [line for line, _ in chosen]):
            known = self.tasks.get(record.key)
            if known is None or _outside(record.knobs, known[0].config_space):
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
    return [tuple(tensor[1]) for tensor in _tensor_args(task.args)], float(task.flop)


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
    field = next(f for f in _KNOB_VALUE.values() if hasattr(theirs, f))
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


@contextmanager
def _measure_option(runner: Runner) -> Iterator[Any]:
    """Through the tracker when one is given; else measured here, in AutoTVM's own pool of
    child processes, with nothing listening (see :class:`_HereRunner`)."""
    options = {"number": 1, "repeat": 1, "timeout": runner.timeout}
    if runner.tracker is not None:
        host, port = runner.tracker
        rpc = _TrackerRunner(runner.key, host, port, **options)
        yield autotvm.measure_option(builder=_builder(runner), runner=rpc)
        return
    yield autotvm.measure_option(builder=_builder(runner), runner=_HereRunner(**options))


class _TrackerRunner(autotvm.RPCRunner):  # type: ignore[misc]
    """AutoTVM's RPC runner without its check of the tracker at each task: the check asks for
    a device in a session with no timeout, and handed a server that stopped answering (still
    registered) it waited for ever. The supervisor has asked the tracker already
    (:func:`.tuning.device.check_tracker`), and each measurement's session is bounded."""

    def set_task(self, task: Any) -> None:
        self.task = task


class _HereRunner(autotvm.RPCRunner):  # type: ignore[misc]
    """AutoTVM's runner without a device to request: each measurement loads the built library
    in one of the runner's own child processes. AutoTVM's ``LocalRunner`` starts a tracker and
    a server on local TCP ports instead, which any local user could ask for a session and have
    load a library of their own (and hhb-tvm's stock server cannot load what its client sends)."""

    def __init__(self, **options: Any) -> None:
        super().__init__("", "", 0, n_parallel=1, module_loader=_LoadHere(), **options)

    def set_task(self, task: Any) -> None:
        self.task = task

    def get_build_kwargs(self) -> dict[str, Any]:
        """The GPU limits the build checks a schedule against, read off this machine's GPU."""
        kwargs: dict[str, Any] = {"checks": {}}
        if {"cuda", "opencl", "rocm", "vulkan"} & set(self.task.target.keys):
            device = tvm.device(str(self.task.target), 0)
            dims = device.max_thread_dimensions
            kwargs["checks"]["gpu"] = {
                "max_shared_memory_per_block": device.max_shared_memory_per_block,
                "max_threads_per_block": device.max_threads_per_block,
                "max_thread_x": dims[0],
                "max_thread_y": dims[1],
                "max_thread_z": dims[2],
            }
        return kwargs


class _LoadHere:
    """A module loader for ``run_through_rpc`` that loads in the measuring process itself."""

    @contextmanager
    def __call__(self, remote_kwargs: Any, build_result: Any) -> Iterator[tuple[Any, Any]]:
        yield _Here(), tvm.runtime.load_module(build_result.filename)


class _Here:
    """What ``run_through_rpc`` asks of its remote session, answered by this process."""

    def device(self, target: str, index: int) -> Any:
        return tvm.device(target.split()[0], index)

    def get_function(self, name: str) -> Any:
        return tvm.get_global_func(name)


#: The causes of failed measurements, one a line (AutoTVM's log keeps only an error code).
ERRORS_FILE = "autotvm_errors.jsonl"
FILES = RecordFiles(LOG, ERRORS_FILE)


def _keep(work_dir: Path) -> Callable[[Any, Any, Any], None]:
    """An AutoTVM callback appending a batch's records and its failures' causes (a failed
    result's costs hold the traceback and the error) together, for the work dir's other
    writers (AutoTVM's ``log_to_file`` writes through a buffer that can cut a line in two)."""

    def keep(tuner: Any, inputs: Any, results: Any) -> None:
        records = [
            autotvm.record.encode(inp, res) for inp, res in zip(inputs, results, strict=True)
        ]
        causes = [failure_cause(_report(res.costs[-1]) if res.costs else "")
                  for res in results if res.error_no != 0]  # fmt: skip
        append(work_dir, [(LOG, records), (ERRORS_FILE, cause_lines(causes))])

    return keep


def _report(cost: Any) -> str:
    """A failed result's report as lines: a failed build's is a (traceback, error) pair, whose
    ``str`` is one line of escaped newlines ending in the error; an error with no message (the
    builder's ``TimeoutError()``) is told by its type."""
    if isinstance(cost, tuple):
        return "\n".join(map(_report, cost))
    return str(cost) or (type(cost).__name__ if isinstance(cost, BaseException) else "")


def _builder(runner: Runner) -> Any:
    """``--timeout`` bounds each build as it bounds each run."""
    return autotvm.LocalBuilder(timeout=runner.timeout)


def check_configs(natives: Sequence[autotvm.task.Task], work_dir: Path) -> None:
    """A record of one of ``natives`` that a build or a tune may apply (its fastest,
    :data:`.index.SEED` a task) may only choose values its config space holds: AutoTVM
    applies a record's knobs as written, and a value no search draws (a split that does not
    divide, an unroll of millions) gives schedules nobody meant to build. Records of other
    tasks (other models sharing the work dir) are never applied to these."""
    spaces = {key(n): n.config_space for n in natives}
    for line, m in best_records(read, FILES, work_dir, spaces, SEED):
        problem = _outside(line.value["config"]["entity"], spaces[m.key])
        if problem:
            raise damaged(work_dir / LOG, line.number, problem)


#: The attribute of a knob's entities that a record's value stands for, by knob kind.
_KNOB_VALUE = {"sp": "size", "re": "perm", "an": "anns", "ot": "val"}


def _outside(knobs: list[list[Any]], space: ConfigSpace) -> str | None:
    """Why a record's knobs (``[name, kind, value]``) are not a point of ``space``, or None."""
    names = [k[0] for k in knobs]
    if not all(isinstance(n, str) for n in names) or sorted(names) != sorted(space.space_map):
        return "its knobs are not those of its task's config space"
    for name, kind, value in knobs:
        field = _KNOB_VALUE[kind]
        if all(getattr(e, field, None) != value for e in space.space_map[name].entities):
            return f"its knob {name!r} = {str(value)[:60]} is outside its task's config space"
    return None


def read(work_dir: Path, lines: Iterable[Line]) -> Iterator[Measurement]:
    for r in _records(work_dir / LOG, lines):
        yield Measurement(r.key, r.seconds, r.error, r.at)


def measurements(work_dir: Path) -> list[Measurement]:
    return history(read, work_dir, FILES)


class _Record(NamedTuple):
    """A record of the log, read through the allowlist (:func:`.records.autotvm_problem`)."""

    key: str
    inp: Any
    res: Any
    #: ``[name, kind, value]`` a knob, as the line spells them.
    knobs: list[list[Any]]
    #: The mean of its runs, None for a failed measurement, and then its error's name.
    seconds: float | None
    error: str
    at: float


def _records(log: Path, lines: Iterable[Line]) -> Iterator[_Record]:
    """The records of ``log`` on ``lines``, each checked before AutoTVM decodes it: a line
    that is not one AutoTVM writes is damage (one ``ModelError`` naming the file and the
    line)."""
    for number, _, line, record, _ in lines:
        problem = autotvm_problem(record, autotvm.task.task.TASK_TABLE)
        if problem:
            raise damaged(log, number, problem)
        try:
            inp, res = autotvm.record.decode(line)
            task_key = key(inp.task)
            seconds = sum(res.costs) / len(res.costs) if res.error_no == 0 else None
            error = "" if res.error_no == 0 else autotvm.measure.MeasureErrorNo(res.error_no).name
            at = float(res.timestamp)
        except Exception as err:  # AutoTVM's decoder raises what the line's fields make it raise
            raise damaged(log, number, describe_failure(err)) from err
        yield _Record(task_key, inp, res, record["config"]["entity"], seconds, error, at)


def flops(task: autotvm.task.Task) -> float:
    if not task.flop:  # computed when the config space is built
        task = create_task(task.name, task.args, task.target)
    return float(task.flop)


def build(
    mod: Any,
    target: Target,
    params: Any,
    work_dir: Path,
    tasks: Sequence[TunerTask],
    others: Sequence[TunerTask] = (),
) -> Any:
    """``relay.build`` with the log's best configs of ``tasks`` dispatched to their templates
    (the others, ``others`` among them, keep their fallback configs)."""
    import tvm
    from tvm import relay

    with records_of(read, FILES, tasks, work_dir, CANDIDATES) as log:
        if runs_here(target):
            chosen = _agreeing(log, tasks, target)
            log.write_text("".join(line for _, line in chosen))
            kept = [task for task, _ in chosen]
        else:
            records = tally(read, work_dir, FILES)
            kept = [t for t in tasks if records.of(t.key).valid]
        records = _Found(str(log))
    with records, tvm.transform.PassContext(opt_level=3):
        library = relay.build(mod, target=target, params=params)
    applied = {t.key for t in kept if t.native.workload in records.found}
    # AutoTVM asks every template of a call for its config whatever the other tasks hold:
    # a record unused here is never one a sharer displaced.
    warn_unused(kept, applied, [])
    return library


class _Found(autotvm.task.ApplyHistoryBest):  # type: ignore[misc]
    """The log's best configs, noting the workloads the build asked for and found: a
    record whose workload no template of the build asks for is never applied."""

    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.found: set[Any] = set()

    def _query_inside(self, target: Any, workload: Any) -> Any:
        config = super()._query_inside(target, workload)
        if config is not None:
            self.found.add(workload)
        return config


def _agreeing(log: Path, tasks: Sequence[TunerTask], target: Target) -> list[tuple[TunerTask, str]]:
    """Of ``log``'s lines, each task's best valid one whose config computes what the
    template's fallback config computes (:mod:`.verify`)."""
    by_task: dict[str, list[tuple[float, tuple[str, Any]]]] = {}
    for _, line in record_lines(log):
        inp, res = autotvm.record.decode(line)
        if res.error_no == 0 and res.costs:
            cost = sum(res.costs) / len(res.costs)
            by_task.setdefault(key(inp.task), []).append((cost, (line, inp.config)))
    kept = []
    for task in tasks:
        candidates = by_task.get(task.key, [])
        if not candidates:
            continue
        native = create_task(task.native.name, task.native.args, target)

        def scheduled(record: tuple[str, Any], native: Any = native) -> tvm.IRModule:
            return _lowered(native, record[1], target)

        expected = _expected(native, target)
        chosen = best_agreeing(task.name, candidates, expected, scheduled, target)
        if chosen is not None:
            kept.append((task, chosen[0] + "\n"))
    return kept


def _expected(native: autotvm.task.Task, target: Target) -> Callable[[Any], Any]:
    """What a record's schedule must leave: the fallback config's results where its buffers
    are the record's, else (a config choosing the layouts, as ``conv2d_NCHWc``'s channel
    blocks, which shape the buffers) those of the template's compute under the record's
    config with TVM's plain loop nest; each computed once."""
    fallback = _lowered(native, FallbackConfigEntity(), target)
    kept: dict[int, Any] = {}

    def expected(record: tuple[str, Any]) -> Any:
        plain = _lowered(native, record[1], target, plain=True)
        reference = fallback if _buffer_shapes(plain) == _buffer_shapes(fallback) else plain
        digest = tvm.ir.structural_hash(reference)
        if digest not in kept:
            kept[digest] = results(reference, target)
        return kept[digest]

    return expected


def _buffer_shapes(mod: tvm.IRModule) -> list[list[int]]:
    func = mod["main"]
    return [[int(d) for d in func.buffer_map[p].shape] for p in func.params]


def _lowered(
    task: autotvm.task.Task, config: Any, target: Target, *, plain: bool = False
) -> tvm.IRModule:
    """The template of ``task`` under ``config``, lowered to a TIR module of one ``main``
    (``plain``: its compute only, with TVM's default loop nest instead of its schedule)."""
    from tvm import te

    with target:
        schedule, args = task.instantiate(config)
        if plain:
            schedule = te.create_schedule(list(schedule.outputs))
    return tvm.lower(schedule, args, name="main")


def similar(tasks: Sequence[TunerTask], tuned: Callable[[], Sequence[Tuned]]) -> int:
    """How many of ``tasks`` a tune starts from the configs of similar tasks among ``tuned()``."""
    tutors = _Tutors.of(tuned())
    return sum(bool(tutors.starts(t.native)) for t in tasks)


ADAPTER = Adapter(
    NAME, extract, encode, decode, key, merge, tune, measurements, flops, build,
    (LOG, ERRORS_FILE),
    lambda tasks, work_dir: check_configs([t.native for t in tasks], work_dir),
    lambda tasks, source, work_dir: adopt_lines(read, FILES, tasks, source, work_dir),
    similar,
    FILES,
    read,
)  # fmt: skip
