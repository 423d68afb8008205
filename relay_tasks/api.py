"""The tuner-neutral front door: one function per CLI verb (``extract``, ``tune``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .adapters import Adapter, TunerTask, get_adapter
from .adapters.base import Runner
from .adapters.progress import progress
from .errors import ModelError
from .inputs import ParamsLike, TargetLike, as_target, host_target


def extract(
    mod: Any,
    target: TargetLike | None = None,
    params: ParamsLike = None,
    *,
    tuner: str | Adapter = "meta_schedule",
    **options: Any,
) -> list[TunerTask]:
    """Extract the tasks one tuner would tune, in that tuner's upstream order.

    Parameters
    ----------
    mod : tvm.IRModule or tvm.relay.Function
        The model.
    target : str or tvm.target.Target, optional
        Defaults to this machine's CPU (see :func:`relay_tasks.host_target`).
    params : dict of str to numpy.ndarray or tvm.nd.NDArray, optional
        Weights bound into ``main`` by name.
    tuner : {"meta_schedule", "autotvm", "ansor"} or Adapter
        Whose tasks to produce.
    **options
        Keyword options of that tuner's extractor (e.g. ``module_equality``).

    Returns
    -------
    list of TunerTask
        Each with ``name``, ``weight``, ``anchor_op``, ``key`` and the tuner's ``native`` task.
    """
    adapter = get_adapter(tuner)
    return adapter.extract(mod, host_target() if target is None else target, params, **options)


def extract_models(
    models: Sequence[tuple[str, Any, ParamsLike]],
    target: TargetLike | None = None,
    *,
    tuner: str | Adapter = "meta_schedule",
    **options: Any,
) -> list[TunerTask]:
    """One task list for several models: equal tasks (same key) merge and their weights add.

    ``models`` are ``(name, mod, params)`` triples. Tasks keep the order in which they first
    appear; each remembers which models use it. This is how a fleet of models is tuned once.
    """
    adapter = get_adapter(tuner)
    tgt = host_target() if target is None else as_target(target)
    groups: dict[str, list[TunerTask]] = {}
    for name, mod, params in progress(models, "extracting"):
        for task in adapter.extract(mod, tgt, params, **options):
            groups.setdefault(task.key, []).append(replace(task, models=(name,)))
    return [_merged(adapter, tasks) for tasks in groups.values()]


def _merged(adapter: Adapter, tasks: list[TunerTask]) -> TunerTask:
    if len(tasks) == 1:
        return tasks[0]
    models = tuple(dict.fromkeys(m for t in tasks for m in t.models))
    return replace(
        tasks[0],
        weight=sum(t.weight for t in tasks),
        native=adapter.merge(tasks),
        models=models,
    )


def tune(
    tasks: Sequence[TunerTask],
    target: TargetLike,
    *,
    tuner: str | Adapter,
    trials: int,
    work_dir: str | Path,
    rpc_tracker: str | None = None,
    rpc_key: str | None = None,
    timeout: float = 20.0,
) -> int:
    """Tune tasks with their tuner, logging to ``work_dir``; returns the measurements logged.

    The log (AutoTVM ``autotvm.log``, Ansor ``ansor.json``, MetaSchedule's JSON database) is
    the resume point: running again with the same ``work_dir`` keeps every finished measurement
    and spends only the trials still missing. ``rpc_tracker`` (``host:port``) and ``rpc_key``
    measure on devices behind a TVM RPC tracker instead of this machine.
    """
    if trials < 1:
        raise ModelError(f"trials must be at least 1, got {trials}")
    if not tasks:
        raise ModelError("there are no tasks to tune (the model has no tunable operator)")
    adapter = get_adapter(tuner)
    folder = Path(work_dir)
    folder.mkdir(parents=True, exist_ok=True)
    runner = Runner(parse_tracker(rpc_tracker, rpc_key), rpc_key, timeout)
    from .errors import TuningError, describe_failure

    try:
        return adapter.tune(tasks, as_target(target), trials, folder, runner)
    except (OSError, RuntimeError) as err:
        raise TuningError(f"{adapter.name} tuning failed: {describe_failure(err)}") from err


def parse_tracker(address: str | None, key: str | None) -> tuple[str, int] | None:
    if address is None:
        if key is not None:
            raise ModelError("--rpc-key needs --rpc-tracker HOST:PORT")
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or key is None:
        raise ModelError(
            f"cannot use RPC tracker {address!r}: give --rpc-tracker HOST:PORT and --rpc-key KEY"
        )
    return host, int(port)
