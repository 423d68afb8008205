"""The pipeline's pass prefix walked one pass at a time, for tests that look at what a
particular pass receives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import tvm
from tvm import relay

from relay_tasks.adapters.meta_schedule import DEFAULT_PASS_CONFIG
from relay_tasks.inputs import as_module
from relay_tasks.optimize.pipeline import (
    Group,
    PassSettings,
    bind_params,
    extraction_scope,
    pass_prefix,
    run_passes,
)


def modules_before_each_pass(
    mod: tvm.IRModule, params: Any, target: str
) -> Iterator[tuple[str, tvm.IRModule]]:
    """Each pass's name and the typed module it is given, in the extraction's target and
    PassContext (still entered while the caller looks at the module)."""
    with extraction_scope(
        tvm.target.Target(target), PassSettings(config=dict(DEFAULT_PASS_CONFIG))
    ):
        current = bind_params(as_module(mod), params)
        for step in pass_prefix():
            name = step.name if isinstance(step, Group) else str(step.info.name)
            yield name, relay.transform.InferType()(current)
            current = run_passes([step], current)
