"""A library built with the work dir's best configs: only those whose schedule computes what
their template's fallback config computes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tvm
from tvm import autotvm
from tvm.autotvm.task.space import FallbackConfigEntity
from tvm.target import Target

from ..base import (
    TunerTask,
    record_lines,
)
from ..index import records_of, tally
from ..untuned import warn_unused
from ..verify import CANDIDATES, best_agreeing, results, runs_here
from .database import FILES, read
from .tasks import create_task, key


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
