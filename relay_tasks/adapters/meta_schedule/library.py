"""A library built with the work dir's best records: only those whose schedule computes what
their task computes.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import meta_schedule as ms
from tvm.ir import IRModule
from tvm.meta_schedule.utils import derived_object
from tvm.target import Target

from ...errors import RelayTasksWarning
from ..base import TunerTask, note_function
from ..untuned import covered_by, untuned_as_without, variants_of, warn_unused
from ..verify import CANDIDATES, best_agreeing, results, runs_here
from .database import (
    WorkDatabase,
    workload_key,
)
from .prefetch import prefetch_weights
from .tasks import register_intrinsics

#: The annotation of the block in which MetaSchedule rewrites a weight's layout.
_PREPROC = "meta_schedule.layout_rewrite_preproc"


def build(
    mod: IRModule,
    target: Target,
    params: Any,
    work_dir: Path,
    tasks: Sequence[TunerTask],
    others: Sequence[TunerTask] = (),
    ranks: Mapping[str, int] | None = None,
) -> Any:
    """``compile_relay`` with the work dir's records of ``tasks``: each takes its best that
    computes what it computes (with ``ranks``, by task key, the best from its ``rank``-th
    fastest record on, counted from 0); the other tasks (``others`` among them) get TVM's
    default schedules (:mod:`.untuned`)."""
    register_intrinsics(target)  # a record's trace may tensorize with one
    database = WorkDatabase(work_dir, [t.native.dispatched[0] for t in tasks], keep=CANDIDATES)
    memory, kept = _agreeing(database.memory, tasks, target, ranks or {})
    unchecked = [t for t in tasks if t not in kept]
    covered = covered_by(kept, [*others, *unchecked])
    asked = _Asked(memory)
    variants = variants_of([*tasks, *others])
    with untuned_as_without("relay.backend.use_meta_schedule", covered, variants):
        library = ms.relay_integration.compile_relay(
            asked, mod, target, params, pass_config=pass_config(target)
        )
    warn_unused(kept, asked.applied, [*others, *unchecked])
    return library


def pass_config(target: Target) -> dict[str, Any]:
    """``compile_relay``'s own settings; on a CPU, with the weights' prefetches
    (:mod:`.prefetch`)."""
    config: dict[str, Any] = {
        "relay.backend.use_meta_schedule": True,
        "relay.backend.tir_converter": "default",
    }
    if target.kind.name == "llvm":
        config["tir.add_lower_pass"] = [(1, prefetch_weights())]
    return config


@derived_object
class _Asked(ms.database.PyDatabase):  # type: ignore[misc]
    """A database that answers as ``inner`` does and notes the workloads the build found a
    record for (by :func:`.database.workload_key`), and for which function."""

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
            key = workload_key(record.workload.mod)
            self.applied.add(key)
            note_function(name, key)
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
    memory: Any, tasks: Sequence[TunerTask], target: Target, ranks: Mapping[str, int]
) -> tuple[Any, list[TunerTask]]:
    """A database of each task's best record that computes what the task computes
    (:mod:`.verify`), from its ``ranks``-th fastest on where one of those does, and the tasks
    that have one; ``memory`` as it is where this machine cannot run the target's code."""
    if not runs_here(target):
        return memory, list(tasks)
    checked = ms.database.MemoryDatabase()
    kept = []
    for task in tasks:
        module = task.native.dispatched[0]
        best = memory.get_top_k(memory.commit_workload(module), CANDIDATES)
        candidates = sorted(
            ((float(np.mean([float(s) for s in r.run_secs])), r) for r in best),
            key=lambda c: c[0],
        )
        candidates = _buildable(task.name, candidates)
        rank = max(min(ranks.get(task.key, 0), len(candidates) - 1), 0)
        expected = results(module, target)
        record = best_agreeing(task.name, candidates[rank:], expected, _scheduled, target)
        if record is None and rank:  # none from there computes right: the best that does
            record = best_agreeing(task.name, candidates, expected, _scheduled, target)
        if record is not None:
            workload = checked.commit_workload(module)
            checked.commit_tuning_record(ms.database.TuningRecord(
                record.trace, workload, record.run_secs, record.target, record.args_info
            ))  # fmt: skip
            kept.append(task)
    return checked, kept


def _buildable(name: str, candidates: list[tuple[float, Any]]) -> list[tuple[float, Any]]:
    """The ``candidates`` a model can be built with, the others warned about. A record may
    rewrite a dense's weight into one dimension: alone it computes right, but in a model
    TOPI's dense asserts two dimensions before it reads the weight's original shape, and the
    whole build failed ("1-dim matmul is not supported yet")."""
    kept = [c for c in candidates if not _flattens_a_matrix(_scheduled(c[1]))]
    if len(kept) < len(candidates):
        warnings.warn(
            f"{name}: {len(candidates) - len(kept)} of its best records rewrite a weight "
            "matrix into one dimension, which TVM cannot build in a model; passed over",
            RelayTasksWarning,
            stacklevel=3,
        )
    return kept


def _flattens_a_matrix(scheduled: IRModule) -> bool:
    """Whether a layout rewrite in ``scheduled`` (MetaSchedule's preprocessing block) turns a
    two-dimensional buffer into a one-dimensional one."""
    found: list[bool] = []

    def visit(node: Any) -> None:
        if isinstance(node, tvm.tir.Block) and _PREPROC in node.annotations:
            before, after = node.reads[0].buffer, node.writes[0].buffer
            found.append(len(before.shape) == 2 and len(after.shape) < 2)

    tvm.tir.stmt_functor.post_order_visit(scheduled["main"].body, visit)
    return any(found)


def _scheduled(record: Any) -> IRModule:
    schedule = tvm.tir.Schedule(record.workload.mod)
    record.trace.apply_to_schedule(schedule, remove_postproc=False)
    return schedule.mod
