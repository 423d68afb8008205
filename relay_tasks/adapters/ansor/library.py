"""A library built with the work dir's best states: only those whose schedule computes what
their task computes, the ones whose layout rewrite fails applied without it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tvm
from tvm import auto_scheduler, relay
from tvm.auto_scheduler.relay_integration import TracingEnvironment, TracingMode
from tvm.target import Target

from ..base import (
    TunerTask,
    record_lines,
)
from ..index import (
    records_of,
)
from ..untuned import covered_by, untuned_as_without, variants_of, warn_unused
from ..verify import CANDIDATES, best_agreeing, results, runs_here
from .database import FILES, read
from .tasks import PASS_CONFIG, rewrite_fails


class _BestWithoutFailingRewrites(auto_scheduler.ApplyHistoryBest):  # type: ignore[misc]
    """The log's best states, kept from the build's layout-rewrite pass for the workloads
    whose rewrite fails (:func:`rewrite_fails`): the pass then leaves their weights as they
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
        t.native.workload_key for t in tasks if rewrite_fails(t.native.compute_dag)
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
    as measured (or left, where the rewrite fails: :func:`rewrite_fails`)."""
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
