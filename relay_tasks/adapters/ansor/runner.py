"""Where Ansor's candidates are measured: here, or through a tracker, every session bounded."""

from __future__ import annotations

import math
from typing import Any

from tvm import auto_scheduler
from tvm.contrib.popen_pool import PopenPoolExecutor

from ..base import (
    SESSION_MARGIN,
    TIMING,
    Runner,
)


def runner_of(runner: Runner) -> Any:
    if runner.tracker is None:
        return auto_scheduler.LocalRunner(timeout=timeout_seconds(runner), **TIMING._asdict())
    host, port = runner.tracker
    _BoundedPool.bound = timeout_seconds(runner) + SESSION_MARGIN
    auto_scheduler.measure.PopenPoolExecutor = _BoundedPool
    # Ansor's runner first asks the tracker for a device in a session of its own, with no
    # timeout: handed a server that stopped answering, it waited for ever before the first
    # measurement. The supervisor has asked the tracker already (.tuning.device.check_tracker).
    auto_scheduler.measure.check_remote = lambda *args, **kwargs: True
    return auto_scheduler.RPCRunner(
        runner.key, host, port, timeout=timeout_seconds(runner), **TIMING._asdict()
    )


class _BoundedPool(PopenPoolExecutor):  # type: ignore[misc]
    """Ansor's RPC runner makes its pool without a timeout: a measurement on a device that
    stopped answering (its server stopped, not gone: still registered) waited for ever, and the
    tune with it. A pool made without one gets :attr:`bound`: the measurement fails as a run
    timeout, the tracker hands that server nothing more (it never reports back free), and the
    tune goes on with the others. Pools made with a timeout (the builder's) keep theirs."""

    bound: float | None = None

    def __init__(self, max_workers: int | None = None, timeout: float | None = None,
                 *args: Any, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(max_workers, self.bound if timeout is None else timeout, *args, **kwargs)


def timeout_seconds(runner: Runner) -> int:
    """Ansor takes whole seconds; a fraction of one rounds up, never to no time at all."""
    return max(1, math.ceil(runner.timeout))
