"""The tuner-neutral front door to extraction: one model or several, any tuner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .adapters import Adapter, TunerTask, get_adapter
from .adapters.base import merge_equal
from .adapters.progress import progress
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
    return merge_equal(
        adapter,
        [replace(task, models=(name,))
         for name, mod, params in progress(models, "extracting")
         for task in adapter.extract(mod, tgt, params, **options)],
    )  # fmt: skip
