"""Ansor's search tasks from the shared backend: each distinct function handed, under the name
the VM compiler gives it, to ``auto_schedule_topi``, and the compiler's report of uses
replayed in its order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import tvm
from tvm import auto_scheduler, te, topi
from tvm.auto_scheduler import relay_integration as upstream
from tvm.auto_scheduler.relay_integration import TracingEnvironment, TracingMode
from tvm.auto_scheduler.workload_registry import register_workload_tensors
from tvm.target import Target

from ...errors import (
    ExtractionError,
    ModelError,
    TargetError,
    UsageError,
    describe_failure,
)
from ...inputs import ParamsLike, TargetLike
from ...ir import dunders_answered_in_python
from ...lowering.extract import (
    Task,
    display_name,
    in_call_order,
    lower_function,
    run_extraction,
    warn_skipped_dynamic,
)
from ...lowering.vm_cache import op_weights, storage_size_tasks, vm_function_names
from ...optimize.pipeline import PassSettings, extraction_scope
from ...request import Request
from ..base import (
    TunerTask,
)
from ..functions import read_source, source_data

NAME = "ansor"


PASS_CONFIG = {"relay.backend.use_auto_scheduler": True}


#: Upstream extracts before the layout rewrite that tuning results would drive.
DISABLED_PASSES = frozenset({"AutoSchedulerLayoutRewrite"})


def extract_tasks(
    mod: Any,
    target: TargetLike,
    params: ParamsLike = None,
    *,
    target_host: TargetLike | None = None,
    hardware_params: Any = None,
    include_simple_tasks: bool = False,
    dump_workload_to_dag_log: str | None = None,
    opt_level: int = 3,
) -> tuple[list[auto_scheduler.SearchTask], list[int]]:
    """Extract Ansor search tasks and weights, equal to ``auto_scheduler.extract_tasks``.

    The arguments come in the order of every relay-tasks extractor, ``(mod, target, params)``;
    upstream's ``(mod, params, target)`` is what the drop-in (:mod:`relay_tasks.dropin`) takes.

    Parameters
    ----------
    mod : tvm.IRModule or tvm.relay.Function
        The model.
    target, target_host : str or tvm.target.Target
        The target (and host) to tune for.
    params : dict of str to numpy.ndarray or tvm.nd.NDArray, optional
        Weights bound into ``main`` by name.
    hardware_params : auto_scheduler.HardwareParams, optional
        Passed to every ``SearchTask``; required for CUDA targets on a machine without CUDA.
    include_simple_tasks : bool
        Also return tasks without a reduction (elementwise and layout functions).
    dump_workload_to_dag_log : str, optional
        Write the workload-key -> compute DAG map to this JSON file, as upstream does.
    opt_level : int
        The optimisation level.

    Returns
    -------
    tasks : list of auto_scheduler.SearchTask
    weights : list of int
    """
    if isinstance(target, (Mapping, tvm.ir.container.Map)):
        raise UsageError(
            "relay_tasks.ansor.extract_tasks takes (mod, target, params); these arguments are "
            "in upstream's order (mod, params, target), which auto_scheduler.extract_tasks takes "
            "with relay_tasks.install()"
        )
    request = _request(mod, target, params, target_host, opt_level)
    pairs = _extract(request, hardware_params, include_simple_tasks)
    tasks = [search for search, _, _ in pairs]
    if dump_workload_to_dag_log is not None:
        with open(dump_workload_to_dag_log, "w") as handle:
            json.dump({t.workload_key: str(t.compute_dag) for t in tasks}, handle)
    return tasks, [weight for _, weight, _ in pairs]


def extract(
    mod: Any, target: TargetLike, params: ParamsLike = None, **options: Any
) -> list[TunerTask]:
    """The registry's entry point (note: ``(mod, target, params)`` like every other tuner)."""
    allowed = {"target_host", "hardware_params", "include_simple_tasks", "opt_level"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ModelError(f"unknown Ansor option(s): {', '.join(unknown)}")
    request = _request(mod, target, params, options.get("target_host"), options.get("opt_level", 3))
    pairs = _extract(
        request,
        options.get("hardware_params") or default_hardware_params(request.target),
        bool(options.get("include_simple_tasks", False)),
    )
    return [
        # The description joins names from a set (process-dependent order); sorted for display.
        TunerTask(
            ",".join(sorted(search.desc.split(","))),
            weight,
            source.anchor_op,
            key(search),
            search,
            source=source,
        )
        for search, weight, source in pairs
    ]


def key(task: auto_scheduler.SearchTask) -> str:
    """The workload key (hash of the compute DAG and shapes) is Ansor's identity of a task."""
    return hashlib.sha256(task.workload_key.encode()).hexdigest()[:16]


def encode(task: TunerTask) -> dict[str, Any]:
    return source_data(task)


def decode(
    payload: dict[str, Any], target: Target, name: str, weight: int
) -> tuple[auto_scheduler.SearchTask, Task]:
    """The search task of the compute its function lowers to here (its key: that compute's)."""
    func, constant_names = read_source(payload)
    with extraction_scope(target, PassSettings(3, PASS_CONFIG, DISABLED_PASSES)):
        source = lower_function(func, target, constant_names=constant_names)
        tensors = upstream.traverse_to_get_io_tensors(_schedulable_outputs(source))[0]
    if not tensors:
        raise ValueError("its function has a dynamic shape, which Ansor cannot tune")
    workload_key = auto_scheduler.ComputeDAG(tensors).workload_key()
    register_workload_tensors(workload_key, tensors)
    search = _search_task(
        workload_key=workload_key,
        target=target,
        hardware_params=default_hardware_params(target),
        layout_rewrite_option=auto_scheduler.LayoutRewriteOption.get_target_default(target, True),
        desc=name,
    )
    return search, source


def merge(tasks: Sequence[TunerTask]) -> auto_scheduler.SearchTask:
    return tasks[0].native


def measurable(task: auto_scheduler.SearchTask) -> auto_scheduler.SearchTask:
    """The task as Ansor can measure it: where its layout rewrite fails on every schedule, the
    same task without the rewrite (the extraction keeps upstream's option; only the tuning
    drops it, and :func:`build` applies such records without rewriting the weights)."""
    if task.layout_rewrite_option == _NO_REWRITE or not rewrite_fails(task.compute_dag):
        return task
    state = task.__getstate__()
    state["layout_rewrite_option"] = _NO_REWRITE
    copy: auto_scheduler.SearchTask = auto_scheduler.SearchTask.__new__(auto_scheduler.SearchTask)
    copy.__setstate__(state)
    return copy


_NO_REWRITE = auto_scheduler.LayoutRewriteOption.NO_REWRITE


def rewrite_fails(dag: auto_scheduler.ComputeDAG) -> bool:
    """Whether Ansor's layout rewrite of the weights fails on this compute, shown on its
    simplest schedule (one split of the weight reader's first axis): on this TVM build it
    fails on every schedule of ``nn.dense`` (its index rewriter finds no index for an axis of
    the rewritten layout), so upstream's tune of a BERT measured no valid dense schedule."""
    state = dag.get_init_state()
    reader = next((op for op in dag.ops if isinstance(op, te.ComputeOp)
                   and "layout_free_placeholders" in op.attrs), None)  # fmt: skip
    if reader is None:
        return False
    state.split(reader, state[reader].iters[0], [1])
    try:
        dag.rewrite_layout_from_state(state)
    except tvm.TVMError:
        return True
    return False


def flops(task: auto_scheduler.SearchTask) -> float:
    """Ansor's count, or TIR's estimate where Ansor's counter gives up and says -1 (on a
    ``select``, which global average pooling's divisor holds): a negative count would be shown
    as such and divide by zero where similar tasks are told apart by their FLOPs."""
    counted = float(task.compute_dag.flop_ct)
    if counted >= 0:
        return counted
    func = te.create_prim_func(list(task.compute_dag.tensors))
    return float(tvm.tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))


def default_hardware_params(target: Target) -> Any:
    """Hardware parameters for targets this machine cannot be asked about (CUDA without a GPU).

    Upstream's ``SearchTask`` asks the CUDA runtime for the shared memory, threads per block and
    warp size, which this TVM build cannot; they shape the search, not which tasks exist. Here
    they come from the target (``-max_shared_memory_per_block``, ``-max_num_threads``,
    ``-thread_warp_size``; 48 KiB shared memory unless given), the rest by upstream's rule.
    """
    if target.kind.name != "cuda":
        return None
    warp_size = int(target.attrs.get("thread_warp_size", 32))
    return auto_scheduler.HardwareParams(
        num_cores=-1,
        vector_unit_bytes=16,
        cache_line_bytes=64,
        max_shared_memory_per_block=int(target.attrs.get("max_shared_memory_per_block", 49152)),
        max_local_memory_per_block=2**31 - 1,  # CUDA sets no limit: upstream disables the check
        max_threads_per_block=int(target.attrs.get("max_num_threads", 1024)),
        max_vthread_extent=warp_size // 4,
        warp_size=warp_size,
    )


def _request(
    mod: Any,
    target: TargetLike,
    params: ParamsLike,
    target_host: TargetLike | None,
    opt_level: int,
) -> Request:
    settings = PassSettings(opt_level, PASS_CONFIG, DISABLED_PASSES)
    return Request.of(mod, target, params, settings, target_host=target_host)


def _extract(
    request: Request, hardware_params: Any, include_simple_tasks: bool
) -> list[tuple[auto_scheduler.SearchTask, int, Task]]:
    tgt = request.target
    tasks = run_extraction(request)
    lowered_in_order = in_call_order(tasks)
    # The compiler lowers in batches: the model's functions, then the storage-size functions its
    # memory planning adds for dynamic shapes.
    batches = [lowered_in_order, storage_size_tasks(lowered_in_order, tgt, request.settings)]
    lowered = [task for batch in batches for task in batch]
    names = vm_function_names(lowered)
    mode = (
        TracingMode.EXTRACT_TASK if include_simple_tasks else TracingMode.EXTRACT_COMPLEX_TASK_ONLY
    )
    env = TracingEnvironment(mode)
    with _tracing(env, tgt):
        for name, task in zip(names, lowered, strict=True):
            _trace(name, task)
        upstream.te_compiler_update_weights(op_weights(batches, names, tgt))
    by_name = dict(zip(names, lowered, strict=True))
    result = []
    for workload_key, (weight, func_names) in env.wkl_key_to_weight.items():
        search = _search_task(
            workload_key=workload_key,
            target=tgt,
            hardware_params=hardware_params,
            layout_rewrite_option=auto_scheduler.LayoutRewriteOption.get_target_default(tgt, True),
            task_inputs=env.wkl_key_to_input_names.get(workload_key),
            task_inputs_save_to_file=True,
            desc=",".join(func_names),
        )
        source = by_name[min(func_names, key=names.index)]
        result.append((search, int(weight), source))
    return result


def _trace(name: str, task: Task) -> None:
    """Hand one lowered function to Ansor's tracing, as the compiler does."""
    outputs = _schedulable_outputs(task)
    try:
        # Upstream's own rule: a task needs static shapes on the tensors its compute reads
        # and writes (a shape_of reads no tensor, so a dynamic input does not count).
        static = upstream.traverse_to_get_io_tensors(outputs)[0]
    except tvm.TVMError as err:  # a shape that reads a tensor (data-dependent): TVM gives up
        raise ExtractionError(
            f"Ansor cannot read the shapes of {display_name(task)} "
            f"({describe_failure(err)}); upstream's extraction fails here too: give the model "
            "static input shapes"
        ) from err
    if not static:
        warn_skipped_dynamic(task, "Ansor")
    elif _computes_only(outputs):
        upstream.auto_schedule_topi(name, outputs)


def _computes_only(outputs: Sequence[te.Tensor]) -> bool:
    """Whether Ansor's ``ComputeDAG`` can take what computes ``outputs``: compute ops down to
    placeholders, nothing else. Its hook would fail on anything else and give no task, as it
    does, but only after raising a TVM error, whose first backtrace in a process costs 0.17 s
    (x86's concatenate of static shapes is an extern op: the Llama decoder's one was half of
    its Ansor extraction)."""
    seen: set[int] = set()
    stack = [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op.handle.value in seen or isinstance(op, te.PlaceholderOp):
            continue
        if not isinstance(op, te.ComputeOp):
            return False
        seen.add(op.handle.value)
        stack += [t.op for t in op.input_tensors]
    return True


def _search_task(**kwargs: Any) -> auto_scheduler.SearchTask:
    try:
        # The workload's compute is built again, numpy probes included (see the pipeline's
        # dunders_answered_in_python).
        with dunders_answered_in_python():
            return auto_scheduler.SearchTask(**kwargs)
    except tvm.TVMError as err:
        if "device_api" in str(err) and kwargs.get("hardware_params") is None:
            raise TargetError(
                f"Ansor needs hardware_params for {kwargs['target'].kind.name} on this machine "
                "(no runtime to ask): pass hardware_params=auto_scheduler.HardwareParams(...)"
            ) from err
        raise


@contextmanager
def _tracing(env: TracingEnvironment, target: Target) -> Iterator[None]:
    from tvm import autotvm

    dispatch = auto_scheduler.DispatchContext.current
    verbose, silent = dispatch.verbose, autotvm.GLOBAL_SCOPE.silent
    dispatch.verbose, autotvm.GLOBAL_SCOPE.silent = 0, True
    try:
        with env, target:
            yield
    finally:
        dispatch.verbose, autotvm.GLOBAL_SCOPE.silent = verbose, silent


def _schedulable_outputs(task: Task) -> list[te.Tensor]:
    """The outputs the compiler schedules: an output that is just an input gets copied."""
    return [topi.identity(t) if isinstance(t.op, te.PlaceholderOp) else t for t in task.outputs]
