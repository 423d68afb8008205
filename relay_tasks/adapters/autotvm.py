"""AutoTVM: shared tasks -> ``tvm.autotvm.task.Task``, equal to ``extract_from_program``.

Upstream lowers the whole model with the VM compiler under AutoTVM's ``TaskExtractEnv``, which
records a template (name and arguments) every time an AutoTVM-registered TOPI compute runs. The
shared backend runs the very same computes when it lowers each distinct function to TE, so here
that environment is on while the backend works; what each function records is kept apart and put
together again in the order the VM compiler would have lowered the functions (call order).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tvm import autotvm
from tvm.autotvm.task import TaskExtractEnv
from tvm.autotvm.task.dispatcher import DispatchContext, FallbackContext

from ..errors import ModelError
from ..extract import Task, run_extraction
from ..inputs import ParamsLike, TargetLike, as_target
from ..pipeline import PassSettings
from .base import Adapter, TunerTask

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
    return [task for _, task in _extract(mod, target, params, ops, opt_level, target_host)]


def extract(
    mod: Any, target: TargetLike, params: ParamsLike = None, **options: Any
) -> list[TunerTask]:
    """The registry's entry point: :func:`extract_tasks` as :class:`TunerTask` rows."""
    allowed = {"ops", "opt_level", "target_host"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ModelError(f"unknown AutoTVM option(s): {', '.join(unknown)}")
    pairs = _extract(
        mod,
        target,
        params,
        options.get("ops"),
        options.get("opt_level", 3),
        options.get("target_host"),
    )
    return [
        TunerTask(
            task.name,
            weight,
            source.anchor_op if source else "",
            source.key if source else "",
            task,
        )
        for (source, task), weight in zip(pairs, _weights(pairs), strict=True)
    ]


ADAPTER = Adapter(NAME, extract)


def _weights(pairs: list[tuple[Task | None, autotvm.task.Task]]) -> list[int]:
    # AutoTVM tasks carry no weight; the neutral weight of the function that first needed the
    # template is the closest meaningful figure for a table.
    return [source.weight if source else 1 for source, _ in pairs]


def _extract(
    mod: Any,
    target: TargetLike,
    params: ParamsLike,
    ops: Sequence[Any] | None,
    opt_level: int,
    target_host: TargetLike | None,
) -> list[tuple[Task | None, autotvm.task.Task]]:
    tgt = as_target(target)
    if target_host is not None:
        tgt = tvm_target_with_host(tgt, as_target(target_host))
    settings = PassSettings(opt_level, {}, DISABLED_PASSES)
    env = TaskExtractEnv.get()
    env.reset(list(ops) if ops is not None else None)
    before_lowering: list[tuple[str, Any]] = []
    tasks = run_extraction(
        mod,
        tgt,
        params,
        settings,
        environment=lambda: _tracing(env, before_lowering),
        lowering_scope=lambda: _per_function(env),
    )
    records: list[tuple[Task | None, tuple[str, Any]]] = [(None, r) for r in before_lowering]
    for task in sorted(tasks, key=lambda t: t.calls[0] if t.calls else len(tasks) + t.visits[0]):
        records += [(task, record) for record in task.traced]
    result: list[tuple[Task | None, autotvm.task.Task]] = []
    seen: set[tuple[str, Any]] = set()
    for source, (name, args) in records:
        if (name, args) in seen:
            continue
        seen.add((name, args))
        try:
            result.append((source, autotvm.task.create(name, args, target=tgt)))
        except _invalid_shape_error():
            continue  # upstream drops these too (with a warning)
    return result


def _invalid_shape_error() -> type[Exception]:
    from tvm import topi

    return topi.InvalidShapeError  # type: ignore[no-any-return]


def tvm_target_with_host(target: Any, host: Any) -> Any:
    from tvm.target import Target

    return Target(target, host)


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
