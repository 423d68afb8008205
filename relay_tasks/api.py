"""The tuner-neutral front door: one call per CLI verb."""

from __future__ import annotations

from typing import Any

from .adapters import Adapter, TunerTask, get_adapter
from .inputs import ParamsLike, TargetLike, host_target


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
