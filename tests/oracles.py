"""Upstream's own extractors, called exactly as a user would, cached per session.

These are the references every equality test compares with. Each call gets a private copy of the
model (see ``zoo.load``) because upstream binds params into the module it is given.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import tvm
from tvm import meta_schedule as ms
from tvm import relay
from tvm.meta_schedule.database import PyDatabase
from tvm.meta_schedule.utils import derived_object

from zoo import copy_module, load


@functools.cache
def meta_schedule(model: str, target: str, module_equality: str = "structural") -> list:
    """``tvm.meta_schedule.relay_integration.extract_tasks`` (the C++ ExtractTask)."""
    return meta_schedule_of(*load(model), target, module_equality)


@dataclass(frozen=True)
class LoweredQuery:
    name: str
    mod: tvm.IRModule


@derived_object
class _RecordingDatabase(PyDatabase):
    """Records every workload the compiler asks MetaSchedule for; never has a record."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[LoweredQuery] = []

    def has_workload(self, mod):
        return False

    def commit_workload(self, mod):
        return ms.database.Workload(mod)

    def commit_tuning_record(self, record):
        return None

    def get_top_k(self, workload, top_k):
        return []

    def get_all_tuning_records(self):
        return []

    def query_tuning_record(self, mod, target, workload_name):
        self.queries.append(LoweredQuery(str(workload_name), mod))
        return None

    def __len__(self):
        return 0


@functools.cache
def legacy_vm_lowering(model: str, target: str) -> list[LoweredQuery]:
    """What a real ``relay.vm.VMCompiler().lower`` converts to TIR with MetaSchedule on.

    With ``relay.backend.use_meta_schedule`` the compiler's TE compiler turns every primitive
    function it lowers into TIR with the TIR converter and queries the current database with it;
    the queries made while lowering ``main`` (named ``vm_mod_*``) are the functions compiled.
    """
    mod, params = load(model)
    tgt = tvm.target.Target(target)
    database = _RecordingDatabase()
    config = {"relay.backend.use_meta_schedule": True, "relay.backend.tir_converter": "default"}
    with tgt, database, tvm.transform.PassContext(opt_level=3, config=config):
        compiler = relay.vm.VMCompiler()
        compiler.set_params(params)
        compiler.lower(mod, target=tgt)
    return [q for q in database.queries if q.name.startswith("vm_mod_")]


def hardware_params(target: str):
    """Ansor needs explicit hardware parameters for CUDA here (no CUDA runtime to ask)."""
    from tvm import auto_scheduler

    if not target.startswith("cuda"):
        return None
    return auto_scheduler.HardwareParams(
        num_cores=-1,
        vector_unit_bytes=16,
        cache_line_bytes=64,
        max_shared_memory_per_block=49152,
        max_local_memory_per_block=2147483647,
        max_threads_per_block=1024,
        max_vthread_extent=8,
        warp_size=32,
    )


class UpstreamFailed(Exception):
    """Upstream's extraction raised.

    ``traced`` holds the tasks it had traced by then (AutoTVM and Ansor trace each function
    before they schedule and compile it, so a failure in those later stages leaves the tasks
    found so far); None where a failure leaves nothing to see (MetaSchedule's C++ extraction).
    """

    def __init__(self, error: BaseException, traced: list | None = None) -> None:
        super().__init__(f"{type(error).__name__}: {str(error).strip()[-300:]}")
        self.error = error
        self.traced = traced


@contextlib.contextmanager
def thread_failures(failures: list[BaseException]) -> Iterator[None]:
    """Collect what upstream's helper thread raised.

    AutoTVM and Ansor compile the model in a helper thread; an exception there (other than
    Ansor's TVMError, which it re-raises) is only printed, and the caller gets the tasks found
    so far. As an oracle, such a run counts as a failed extraction.
    """
    previous = threading.excepthook
    threading.excepthook = lambda args: failures.append(args.exc_value)
    try:
        yield
    finally:
        threading.excepthook = previous


def meta_schedule_of(mod, params, target: str, module_equality: str = "structural") -> list:
    try:
        return list(
            ms.relay_integration.extract_tasks(
                mod, tvm.target.Target(target), params, module_equality=module_equality
            )
        )
    except Exception as err:
        raise UpstreamFailed(err) from err


@functools.cache
def autotvm_tasks(model: str, target: str) -> list[tuple[str, tuple]]:
    """``autotvm.task.extract_from_program``, as (template name, args) pairs."""
    return autotvm_tasks_of(*load(model), target)


def autotvm_tasks_of(mod, params, target: str) -> list[tuple[str, tuple]]:
    from tvm import autotvm

    from cuda_schedules import cuda_injective_schedules

    failures: list[BaseException] = []
    try:
        with cuda_injective_schedules(), thread_failures(failures):  # see cuda_schedules.py
            tasks = autotvm.task.extract_from_program(mod, target=target, params=params)
    except Exception as err:  # making a task of what it traced (after the thread) failed
        raise UpstreamFailed(err) from err
    rows = [(t.name, t.args) for t in tasks]
    if failures:
        raise UpstreamFailed(failures[0], rows)
    return rows


@functools.cache
def ansor_tasks(model: str, target: str, include_simple_tasks: bool = False) -> list[tuple]:
    """``auto_scheduler.extract_tasks``, as (workload key, description, weight) triples."""
    return ansor_tasks_of(*load(model), target, include_simple_tasks)


def ansor_tasks_of(mod, params, target: str, include_simple_tasks: bool = False) -> list[tuple]:
    from tvm import auto_scheduler

    from cuda_schedules import cuda_injective_schedules

    failures: list[BaseException] = []
    try:
        with cuda_injective_schedules(), thread_failures(failures):
            tasks, weights = auto_scheduler.extract_tasks(
                copy_module(mod),
                params,
                target,
                hardware_params=hardware_params(target),
                include_simple_tasks=include_simple_tasks,
            )
    except Exception as err:  # Ansor re-raises the thread's TVMErrors; others are raised here
        failures.append(err)
    if failures:
        raise UpstreamFailed(failures[0], _ansor_traced(mod, params, target, include_simple_tasks))
    return [(t.workload_key, t.desc, int(w)) for t, w in zip(tasks, weights, strict=True)]


def _ansor_traced(mod, params, target: str, include_simple_tasks: bool) -> list[tuple]:
    """What upstream's Ansor tracing records before its compile fails, as the same triples.

    ``auto_scheduler.extract_tasks`` discards it when it raises, so this runs upstream's own
    tracing environment and compile function again and reads the environment afterwards.
    """
    from tvm.auto_scheduler.relay_integration import (
        TracingEnvironment,
        TracingMode,
        call_all_topi_funcs,
    )

    from cuda_schedules import cuda_injective_schedules

    mode = (
        TracingMode.EXTRACT_TASK if include_simple_tasks else TracingMode.EXTRACT_COMPLEX_TASK_ONLY
    )
    env = TracingEnvironment(mode)
    errors: list[str] = []
    with cuda_injective_schedules(), thread_failures([]), env:
        thread = threading.Thread(
            target=call_all_topi_funcs, args=(mod, params, [tvm.target.Target(target)], errors)
        )
        thread.start()
        thread.join()
    return [
        (key, ",".join(names), int(weight))
        for key, (weight, names) in env.wkl_key_to_weight.items()
    ]
