"""AutoTVM's tasks from the shared backend: templates traced while each distinct function is
lowered to TE, put in the order the VM compiler would have lowered the functions.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tvm import autotvm
from tvm.autotvm.task import TaskExtractEnv
from tvm.autotvm.task.dispatcher import ApplyConfig, DispatchContext, FallbackContext
from tvm.autotvm.task.space import ConfigSpace
from tvm.autotvm.task.task import compute_flop, serialize_args
from tvm.target import Target

from ...errors import ModelError
from ...inputs import ParamsLike, TargetLike
from ...ir import dunders_answered_in_python
from ...lowering.extract import (
    Task,
    display_name,
    in_call_order,
    lower_function,
    run_extraction,
    shape_text,
)
from ...optimize.pipeline import PassSettings, extraction_scope
from ...request import Request
from ..base import (
    TunerTask,
)
from ..functions import only_fields, read_dtype, read_shape, read_source, source_data

NAME = "autotvm"


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
    return [task for _, task, _ in _extract([request], ops)]


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
    return [task for _, task, _ in _extract(requests, ops)]


def extract(
    mod: Any, target: TargetLike, params: ParamsLike = None, **options: Any
) -> list[TunerTask]:
    """The registry's entry point: :func:`extract_tasks` as :class:`TunerTask` rows."""
    allowed = {"ops", "opt_level", "target_host"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ModelError(f"unknown AutoTVM option(s): {', '.join(unknown)}")
    request = _request(mod, target, params, options.get("opt_level", 3), options.get("target_host"))
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
        for source, task, weight in _extract([request], options.get("ops"))
    ]


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
) -> list[tuple[Task | None, autotvm.task.Task, int]]:
    """Each template traced (once, in the order first traced), the function that first
    traced it (None for one a pass traced), and its weight: how often the model runs it, the
    occurrences of every function that traces it summed. Upstream's AutoTVM tasks carry no
    weight; a template is often shared by several functions (a convolution fused with a
    ReLU in one, with a residual add in another), and the first one's count alone left
    ResNet-18's estimated latency at 13 of its 20 convolutions."""
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
    weights: dict[tuple[str, Any], int] = {}
    for source, record in records:
        weights[record] = weights.get(record, 0) + (source.weight if source else 1)
    result: list[tuple[Task | None, autotvm.task.Task, int]] = []
    seen: set[tuple[str, Any]] = set()
    tgt = requests[0].target if requests else None  # one target: with_model keeps it
    for source, (name, args) in records:
        if (name, args) in seen:
            continue
        seen.add((name, args))
        try:
            result.append((source, create_task(name, args, tgt), weights[name, args]))
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
    shapes = (shape_text(tensor[1]) for tensor in tensor_args(args))
    return next((shape for shape in shapes if shape is not None), None)


def tensor_args(args: Any) -> Iterator[tuple[Any, ...]]:
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


def flops(task: autotvm.task.Task) -> float:
    if not task.flop:  # computed when the config space is built
        task = create_task(task.name, task.args, task.target)
    return float(task.flop)
