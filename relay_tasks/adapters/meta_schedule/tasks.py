"""MetaSchedule's extracted tasks from the shared backend: TIR once per distinct function, in
upstream's order and with its names.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import tvm
from tvm import meta_schedule as ms
from tvm import relay
from tvm.ir import IRModule
from tvm.ir.supply import NameSupply
from tvm.target import Target

from ...errors import ModelError
from ...inputs import ParamsLike, TargetLike
from ...lowering.cxx import std_sort
from ...lowering.extract import Task, lower_function, run_extraction, warn_skipped_dynamic
from ...optimize.pipeline import PassSettings, extraction_scope
from ...request import Request
from ..base import (
    TunerTask,
)
from ..functions import read_source, source_data
from .database import (
    workload_key,
)

NAME = "meta_schedule"


MODULE_EQUALITIES = ("structural", "ignore-ndarray", "anchor-block")


#: Upstream's defaults: strategies pick by plevel, and TE becomes TIR with the default converter.
DEFAULT_PASS_CONFIG: Mapping[str, Any] = MappingProxyType(
    {"relay.backend.use_meta_schedule": True, "relay.backend.tir_converter": "default"}
)


def extract_task_from_relay(
    mod: Any,
    target: TargetLike,
    params: ParamsLike = None,
    *,
    opt_level: int = 3,
    pass_config: Mapping[str, Any] = DEFAULT_PASS_CONFIG,
    disabled_pass: Any = None,
    module_equality: str = "structural",
    executor: Any = None,
) -> list[ms.ExtractedTask]:
    """Extract MetaSchedule tuning tasks, equal to ``ms.relay_integration.extract_tasks``.

    Parameters
    ----------
    mod : tvm.IRModule or tvm.relay.Function
        The model.
    target : str or tvm.target.Target
        The target to tune for.
    params : dict of str to numpy.ndarray or tvm.nd.NDArray, optional
        Weights bound into ``main`` by name.
    opt_level, pass_config, disabled_pass
        The PassContext; ``pass_config`` replaces upstream's default as it does upstream.
    module_equality : {"structural", "ignore-ndarray", "anchor-block"}
        How TIR modules are compared when deduplicating tasks.
    executor : relay.backend.Executor, optional
        Attached to a module that names no executor (default: the graph executor), as upstream
        does; with ``link-params`` it decides whether weights become part of the tasks.

    Returns
    -------
    list of tvm.meta_schedule.ExtractedTask
        Ready for ``ms.tune_tasks`` / ``ms.relay_integration.tune_relay``.
    """
    equality = _checked_equality(module_equality)
    request = Request.of(mod, target, params, _settings(opt_level, pass_config, disabled_pass))
    pairs = _extract(request, equality, executor)
    return [extracted for _, extracted in pairs]


def extract(
    mod: Any, target: TargetLike, params: ParamsLike = None, **options: Any
) -> list[TunerTask]:
    """The registry's entry point: :func:`extract_task_from_relay` as :class:`TunerTask` rows."""
    settings = _settings(
        options.pop("opt_level", 3),
        options.pop("pass_config", DEFAULT_PASS_CONFIG),
        options.pop("disabled_pass", None),
    )
    module_equality = _checked_equality(options.pop("module_equality", "structural"))
    if options:
        raise ModelError(f"unknown MetaSchedule option(s): {', '.join(sorted(options))}")
    pairs = _extract(Request.of(mod, target, params, settings), module_equality)
    return [
        TunerTask(et.task_name, int(et.weight), task.anchor_op, key(et), et, source=task)
        for task, et in pairs
    ]


def key(task: ms.ExtractedTask) -> str:
    """MetaSchedule tunes the TIR module: equal modules are one task, across models too."""
    return workload_key(task.dispatched[0])


def _settings(opt_level: int, pass_config: Mapping[str, Any], disabled_pass: Any) -> PassSettings:
    return PassSettings(opt_level, dict(pass_config), frozenset(disabled_pass or ()))


def _checked_equality(module_equality: str) -> str:
    if module_equality not in MODULE_EQUALITIES:
        raise ModelError(
            f"unknown module_equality {module_equality!r}; "
            f"choose one of {', '.join(MODULE_EQUALITIES)}"
        )
    return module_equality


def _extract(
    request: Request, module_equality: str, executor: Any = None
) -> list[tuple[Task, ms.ExtractedTask]]:
    request = replace(request, mod=with_executor(request.mod, executor))
    # Upstream walks main only; what a compiler would lower (and in what order) is not asked.
    tasks = run_extraction(
        request, environment=lambda: tophub_scope(request.target), call_order=None
    )
    return to_extracted_tasks(tasks, request.target, request.settings, module_equality)


def with_executor(mod: IRModule, executor: Any = None) -> IRModule:
    """Attach ``executor`` (the graph executor if None) as upstream's wrapper does, unless the
    module names one: the module's own executor wins."""
    if mod.get_attr("executor") is None:
        return mod.with_attr("executor", executor or relay.backend.Executor("graph"))
    return mod


@contextmanager
def tophub_scope(target: Target) -> Iterator[None]:
    """Upstream's wrapper loads TopHub configs for non-CUDA targets when nothing else is set.

    They decide AlterOpLayout's tiling on x86, so they must be in force here too.
    """
    from tvm import autotvm

    fallback = isinstance(autotvm.DispatchContext.current, autotvm.FallbackContext)
    if target.kind.name != "cuda" and fallback:
        with autotvm.tophub.context(target):
            yield
    else:
        yield


def to_extracted_tasks(
    tasks: Sequence[Task], target: Target, settings: PassSettings, module_equality: str
) -> list[tuple[Task, ms.ExtractedTask]]:
    """Convert shared tasks to ``ExtractedTask`` objects in upstream's order and naming.

    Each comes paired with the shared task it was made from.
    """
    converter_name = str(settings.config.get("relay.backend.tir_converter", "default"))
    with extraction_scope(target, settings):
        tir = {id(t): tir_module(t, converter_name) for t in tasks}
    for task in tasks:
        if tir[id(task)] is None:
            warn_skipped_dynamic(task, "MetaSchedule")
    occurrences = [t for _, t in sorted((v, t) for t in tasks for v in t.visits if tir[id(t)])]
    order = list(range(len(occurrences)))
    if module_equality == "anchor-block":
        # Fewer ops first, so that e.g. conv2d_add_relu (not conv2d_add_add_relu) names a task.
        counts = [_op_count(t.func) for t in occurrences]
        order = std_sort(order, lambda a, b: counts[a] < counts[b])
    database = ms.database.MemoryDatabase(module_equality=module_equality)
    firsts: list[tuple[ms.database.Workload, Task]] = []
    weights: list[int] = []
    committed: dict[int, ms.database.Workload] = {}
    for index in order:
        task = occurrences[index]
        # An occurrence of a task commits the same TIR module again: hashing it is the cost.
        if id(task) not in committed:
            committed[id(task)] = database.commit_workload(tir[id(task)])
        workload = committed[id(task)]
        hit = next((i for i, (wl, _) in enumerate(firsts) if wl.same_as(workload)), None)
        if hit is None:
            firsts.append((workload, task))
            weights.append(1)
        else:
            weights[hit] += 1
    names = NameSupply("")
    result = []
    for (_, task), weight in reversed(list(zip(firsts, weights, strict=True))):
        relay_mod = IRModule({tvm.ir.GlobalVar(task.name): task.func})
        name = names.fresh_name(task.name)
        extracted = ms.ExtractedTask(name, relay_mod, target, [tir[id(task)]], weight)
        result.append((task, extracted))
    return result


def tir_module(task: Task, converter_name: str = "default") -> IRModule | None:
    """The task's TE compute as the TIR module MetaSchedule tunes (None where declined).

    Runs the TIR converter upstream's PassContext names (``relay.backend.tir_converter``).
    """
    converter = tvm.get_global_func(f"relay.backend.tir_converter.{converter_name}", True)
    if converter is None:
        raise ModelError(
            f"unknown relay.backend.tir_converter {converter_name!r}; use 'default' or "
            "'allow_extern', or register relay.backend.tir_converter.<name> first"
        )
    constants = [data for _, data in task.lowered.constants]
    func = converter(task.lowered.tir_args(), constants)
    if func is None:  # the converter declines dynamic shapes and non-compute ops
        return None
    func = func.with_attr({"global_symbol": "main", "tir.noalias": True})
    return IRModule({tvm.ir.GlobalVar("main"): func})


def _op_count(func: relay.Function) -> int:
    count = 0

    def visit(node: Any) -> None:
        nonlocal count
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            count += 1

    relay.analysis.post_order_visit(func.body, visit)
    return count


def encode(task: TunerTask) -> dict[str, Any]:
    return source_data(task)


def decode(
    payload: dict[str, Any], target: Target, name: str, weight: int
) -> tuple[ms.ExtractedTask, Task]:
    """The task lowered here from its primitive function, as extraction lowers it."""
    func, constant_names = read_source(payload)
    settings = _settings(3, DEFAULT_PASS_CONFIG, None)
    with extraction_scope(target, settings), tophub_scope(target):
        source = lower_function(func, target, constant_names=constant_names)
        tir = tir_module(source)
    if tir is None:
        raise ValueError("its function has a dynamic shape, which MetaSchedule cannot tune")
    relay_mod = IRModule({tvm.ir.GlobalVar(source.name): source.func})
    return ms.ExtractedTask(name, relay_mod, target, [tir], weight), source


def merge(tasks: Sequence[TunerTask]) -> ms.ExtractedTask:
    first = tasks[0].native
    weight = sum(int(t.native.weight) for t in tasks)
    return ms.ExtractedTask(
        first.task_name, first.mod, first.target, list(first.dispatched), weight
    )


#: The modules registering the tensor intrinsics that MetaSchedule's default schedule rules
#: look up by name, by target kind (hhb-tvm registers none itself: "TensorIntrin
#: 'dot_16x4_vnni' is not registered"). An LLVM target may be x86 or Arm. Importing all four
#: took 4.0 s of a tune's start, 3.0 of them CUDA's (TVMScript parsing 200 functions).
INTRINSICS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"llvm": ("x86", "arm_cpu"), "cuda": ("cuda",), "rocm": ("rocm",)}
)


def register_intrinsics(target: Target) -> None:
    """Register the tensor intrinsics the schedule rules for ``target`` may ask for (every
    module for a kind not in :data:`INTRINSICS`)."""
    everything = sorted({m for modules in INTRINSICS.values() for m in modules})
    for module in INTRINSICS.get(target.kind.name, everything):
        importlib.import_module(f"tvm.tir.tensor_intrin.{module}")


def flops(task: ms.ExtractedTask) -> float:
    return float(tvm.tir.analysis.estimate_tir_flops(task.dispatched[0]))
