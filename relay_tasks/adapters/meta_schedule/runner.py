"""Where MetaSchedule's candidates are built and measured, each measurement committed to the
work dir's database as it completes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import tvm
from tvm import meta_schedule as ms

from ..allocation import Allocation
from ..base import (
    SESSION_MARGIN,
    TIMING,
    Runner,
    failure_cause,
)
from ..verify import agrees_with, results, runs_here
from .database import (
    WorkDatabase,
)


def task_records(scheduler: Any) -> Any:
    """The scheduler's task records (a derived scheduler answers attributes from its Python
    side, so they are asked of the TVM object itself)."""
    return tvm.runtime.Object.__getattr__(scheduler, "tasks_")


#: Seconds between two looks at a batch's unfinished measurements.
POLL = 0.02


# TVM's derived_object replaces the class, which mutation tools cannot instrument.
@ms.derived_object
class CommitEach(ms.runner.PyRunner):  # type: ignore[misc]  # pragma: no mutate block
    """Commits each measurement to the database, with a failure's cause, as it completes.

    MetaSchedule's task scheduler commits a batch only when it next picks that task, and in its
    first round only once every task has been measured: an interrupt lost all of that. This
    runner hands the scheduler futures that are already done, the records committed as
    MetaSchedule's own callback would commit them (a failure as 1e10 s). The batch being run is
    the task record whose builds are in and whose futures are not yet set.

    A measurement that beats its task's best so far is committed as valid only once its
    schedule computes what the task computes (:meth:`Expected.agrees`); one that does not is a
    failure (:data:`WRONG`), to the database, the allocation and the cost model alike. Slower
    ones are not checked: a build only ever applies a task's fastest records.
    """

    def __init__(self, inner: Any, scheduler: Any, database: WorkDatabase,
                 allocation: Allocation, expected: Expected) -> None:  # fmt: skip
        self.inner, self.scheduler, self.database = inner, scheduler, database
        self.allocation, self.expected = allocation, expected

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        index, task = next(
            (i, t)
            for i, t in enumerate(task_records(self.scheduler))
            if t.builder_results is not None and t.runner_futures is None
        )
        workload = self.database.memory.commit_workload(task.ctx.mod)
        built = {}
        for candidate, result in zip(task.measure_candidates, task.builder_results, strict=True):
            if result.error_msg is None:
                built[str(result.artifact_path)] = candidate
            else:
                self._commit(task, workload, candidate, None, str(result.error_msg))
                self.allocation.measured(index, None)
        running: dict[int, Any] = {}
        results: list[Any] = [None] * len(runner_inputs)

        def commit_finished() -> None:
            for k in [k for k, future in running.items() if future.done()]:
                result = running.pop(k).result()
                path = str(runner_inputs[k].artifact_path)
                seconds = _seconds(result) if result.error_msg is None else None
                improves = seconds is not None and self.allocation.improves(index, seconds)
                if improves and not self.expected.agrees(index, task.ctx, built[path]):
                    result, seconds = ms.runner.RunnerResult(None, WRONG), None
                results[k] = result
                error = None if result.error_msg is None else str(result.error_msg)
                self._commit(task, workload, built[path], result.run_secs, error)
                self.allocation.measured(index, seconds)

        # One input a call: the local runner measures as it is called, an RPC runner returns
        # at once and measures on as many devices as the tracker lends.
        for i, runner_input in enumerate(runner_inputs):
            [running[i]] = self.inner.run([runner_input])
            commit_finished()
        while running:
            time.sleep(POLL)
            commit_finished()
        return [ms.runner.RunnerFuture(lambda: True, lambda r=r: r) for r in results]

    def _commit(self, task: Any, workload: Any, candidate: Any, run_secs: Any, error: str | None
                ) -> None:  # fmt: skip
        if error is not None or not run_secs:
            run_secs = [tvm.tir.FloatImm("float32", 1e10)]  # MetaSchedule's failure mark
        trace, info = candidate.sch.trace, candidate.args_info
        record = ms.database.TuningRecord(trace, workload, run_secs, task.ctx.target, info)
        self.database.commit(record, None if error is None else failure_cause(error))


#: The failure a measured candidate is filed as when its library computes something else.
WRONG = (
    "its code computes something else than its task (checked on seeded arguments): TVM "
    "miscompiled this schedule"
)


class Expected:
    """What each task of a tune leaves in its buffers from the seeded arguments, by task
    index, computed when a candidate of it is first checked and kept for the tune's phases;
    nothing is checked where this machine cannot run the target's code."""

    def __init__(self) -> None:
        self.results: dict[int, Any] = {}
        self.here: bool | None = None

    def agrees(self, index: int, context: Any, candidate: Any) -> bool:
        """Whether ``candidate`` of task ``index`` (``context``) computes what the task
        computes, built here from its schedule as a build would apply it: the library the
        builder exported takes its weights in the layout the schedule rewrote them to, which
        only the schedule itself computes from the task's."""
        if self.here is None:
            self.here = runs_here(context.target)
        if not self.here:
            return True
        if index not in self.results:
            self.results[index] = results(context.mod, context.target)
        return agrees_with(self.results[index], candidate.sch.mod, context.target)


def _seconds(result: Any) -> float | None:
    """A run's latency as the records give it (the mean of its repeats)."""
    secs = [float(s) for s in result.run_secs or ()]
    return sum(secs) / len(secs) if secs else None


#: Seconds MetaSchedule's builder and local runner get for the check they make as they start
#: (a child process looks two functions up): a ``--timeout`` shorter than a loaded host takes
#: to answer it failed the whole tune ("TimeoutError in recv") instead of each measurement.
STARTUP_CHECK = 30.0


#: Starts of a builder or local runner whose check child died (killed: by hand, by the OOM
#: killer) before one is given up.
START_TRIES = 3


def _started(make: Callable[[], Any]) -> Any:
    """``make()``, again where the child its start check ran in died: that child measured no
    candidate, and the pool starts another for the next call."""
    for tried in range(1, START_TRIES + 1):
        try:
            return make()
        except ChildProcessError as err:
            if tried == START_TRIES:
                raise ChildProcessError(
                    f"the child process MetaSchedule starts to check its builder or runner "
                    f"died {START_TRIES} times in a row (killed, or out of memory)"
                ) from err
    raise AssertionError("START_TRIES is at least 1")


def builder_of(runner: Runner) -> Any:
    """``--timeout`` bounds each build as it bounds each run."""
    builder = _started(lambda: ms.builder.LocalBuilder(timeout_sec=max(runner.timeout,
                                                                       STARTUP_CHECK)))  # fmt: skip
    builder.timeout_sec = runner.timeout  # each build's pool is made with it
    return builder


def runner_of(runner: Runner) -> Any:
    timing = ms.runner.EvaluatorConfig(**TIMING._asdict())
    if runner.tracker is None:
        local = _started(lambda: ms.runner.LocalRunner(
            timeout_sec=max(runner.timeout, STARTUP_CHECK), evaluator_config=timing
        ))  # fmt: skip
        local.timeout_sec = local.pool._timeout = runner.timeout  # each run's bound from here on
        return local
    host, port = runner.tracker
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=runner.key,
                                 session_timeout_sec=int(runner.timeout))  # fmt: skip
    remote = ms.runner.RPCRunner(config, evaluator_config=timing)
    # MetaSchedule's RPCRunner makes its pool without a timeout: a measurement on a device that
    # stopped answering (a server stopped, not gone: still registered) waited for ever, and the
    # tune with it. Bounded, it fails as a timeout, the tracker hands that server nothing more
    # (it never reports back free), and the tune goes on with the others.
    remote.pool._timeout = runner.timeout + SESSION_MARGIN
    return remote
