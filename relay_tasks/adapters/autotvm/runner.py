"""Where AutoTVM's candidates are built and measured: through a tracker, or in the runner's
own child processes on this machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tvm
from tvm import autotvm

from ..base import (
    Runner,
)


@contextmanager
def measure_option(runner: Runner) -> Iterator[Any]:
    """Through the tracker when one is given; else measured here, in AutoTVM's own pool of
    child processes, with nothing listening (see :class:`_HereRunner`)."""
    options = {"number": 1, "repeat": 1, "timeout": runner.timeout}
    if runner.tracker is not None:
        host, port = runner.tracker
        rpc = _TrackerRunner(runner.key, host, port, **options)
        yield autotvm.measure_option(builder=builder_of(runner), runner=rpc)
        return
    yield autotvm.measure_option(builder=builder_of(runner), runner=_HereRunner(**options))


class _TrackerRunner(autotvm.RPCRunner):  # type: ignore[misc]
    """AutoTVM's RPC runner without its check of the tracker at each task: the check asks for
    a device in a session with no timeout, and handed a server that stopped answering (still
    registered) it waited for ever. The supervisor has asked the tracker already
    (:func:`.tuning.device.check_tracker`), and each measurement's session is bounded."""

    def set_task(self, task: Any) -> None:
        self.task = task


class _HereRunner(autotvm.RPCRunner):  # type: ignore[misc]
    """AutoTVM's runner without a device to request: each measurement loads the built library
    in one of the runner's own child processes. AutoTVM's ``LocalRunner`` starts a tracker and
    a server on local TCP ports instead, which any local user could ask for a session and have
    load a library of their own (and hhb-tvm's stock server cannot load what its client sends)."""

    def __init__(self, **options: Any) -> None:
        super().__init__("", "", 0, n_parallel=1, module_loader=_LoadHere(), **options)

    def set_task(self, task: Any) -> None:
        self.task = task

    def get_build_kwargs(self) -> dict[str, Any]:
        """The GPU limits the build checks a schedule against, read off this machine's GPU."""
        kwargs: dict[str, Any] = {"checks": {}}
        if {"cuda", "opencl", "rocm", "vulkan"} & set(self.task.target.keys):
            device = tvm.device(str(self.task.target), 0)
            dims = device.max_thread_dimensions
            kwargs["checks"]["gpu"] = {
                "max_shared_memory_per_block": device.max_shared_memory_per_block,
                "max_threads_per_block": device.max_threads_per_block,
                "max_thread_x": dims[0],
                "max_thread_y": dims[1],
                "max_thread_z": dims[2],
            }
        return kwargs


class _LoadHere:
    """A module loader for ``run_through_rpc`` that loads in the measuring process itself."""

    @contextmanager
    def __call__(self, remote_kwargs: Any, build_result: Any) -> Iterator[tuple[Any, Any]]:
        yield _Here(), tvm.runtime.load_module(build_result.filename)


class _Here:
    """What ``run_through_rpc`` asks of its remote session, answered by this process."""

    def device(self, target: str, index: int) -> Any:
        return tvm.device(target.split()[0], index)

    def get_function(self, name: str) -> Any:
        return tvm.get_global_func(name)


def builder_of(runner: Runner) -> Any:
    """``--timeout`` bounds each build as it bounds each run."""
    return autotvm.LocalBuilder(timeout=runner.timeout)
