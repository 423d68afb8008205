"""The VM compiler's lowering cache, as Ansor's extraction sees it.

Upstream's Ansor extraction compiles the model with the VM compiler, so three things of that
compiler shape its tasks: the names it gives the functions it lowers (``vm_mod_fused_...``),
the function-use report it sends when done (``op_weights``: built from a hash-map cache, so its
order is that cache's iteration order, copied through two TVM maps), and the storage-size
functions its memory planning adds for dynamic shapes. Each is reproduced here, with real TVM
maps where TVM's own map order matters and :mod:`relay_tasks.lowering.cxx` for libstdc++'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tvm
from tvm import relay
from tvm.ir.supply import NameSupply
from tvm.target import Target

from ..optimize.pipeline import PassSettings, extraction_scope
from .cxx import hash_combine, std_hash_string, unordered_map_order
from .extract import Task, make_task, shape_text
from .lower import flatten_tuple_type, lower_to_te

#: The module name the VM compiler gives its lowered functions.
VM_MODULE_NAME = "vm_mod"


def vm_function_names(lowered: Sequence[Task]) -> list[str]:
    """The names the VM compiler gives the functions it lowers (e.g. ``vm_mod_fused_nn_dense``)."""
    names = NameSupply(VM_MODULE_NAME)
    names.reserve_name("main", False)
    return [str(names.fresh_name(t.name)) for t in lowered]


def op_weights(batches: Sequence[Sequence[Task]], names: Sequence[str], target: Target) -> Any:
    """The compiler's function-use report: a TVM ``Map`` built exactly as the compiler builds it.

    Each lowering batch has its own cache, a ``std::unordered_map`` keyed by (labelled function,
    target); its iteration order is copied into a TVM ``Map`` (``GetOpWeights``), whose entries
    are then set into the module's ``op_weights`` map, which the batches share. Every copy is
    replayed here with real TVM maps, since a ``Map``'s iteration order depends on the order its
    keys were set.
    """
    target_hash = std_hash_string(str(target))
    report = tvm.IRModule()
    first = 0
    for batch in batches:
        hashes = [
            hash_combine(_structural_hash(_labelled(t.func)), target_hash) or 1 for t in batch
        ]
        cache = [(names[first + i], _uses(batch[i])) for i in unordered_map_order(hashes)]
        report = _map_set(_map_items(_map_set(cache, tvm.IRModule())), report)
        first += len(batch)
    # The map itself: a dict would be copied into a new Map, in pointer-hash order, on its way
    # to the callback.
    return report.attrs._dict() if report.attrs is not None else {}


def _uses(task: Task) -> int:
    """How often the compiler's cache was asked for ``task``: once per call site it lowers (a
    function inside a global function called twice is lowered once); the storage-size functions
    carry their count as their weight."""
    return len(task.calls) or task.weight


def _map_set(items: Sequence[tuple[str, int]], holder: tvm.IRModule) -> tvm.IRModule:
    """Set ``items``, in this order, into the TVM ``Map`` of ``holder``'s attributes."""
    for key, value in items:
        holder = holder.with_attr(str(key), tvm.tir.IntImm("int64", int(value)))
    return holder


def _map_items(holder: tvm.IRModule) -> list[tuple[str, int]]:
    """The entries of ``holder``'s attribute ``Map`` in its iteration order."""
    return list(holder.attrs._dict().items()) if holder.attrs is not None else []


def storage_size_tasks(
    in_call_order: Sequence[Task], target: Target, settings: PassSettings
) -> list[Task]:
    """The storage-size functions the VM's memory planning adds for dynamic shapes, as tasks.

    For each planned call (:class:`~.vm_compiler.Call`) of a function whose result shape is
    known only at run time, ``ManifestAlloc``
    computes the byte size of each output in Relay, ``prod(shape) * item size``, and the compiler
    fuses and lowers those like the model's own functions: a ``prod`` over the int64 shape
    vector and a scalar ``multiply``, each a function of its own. Upstream's Ansor extraction
    compiles the model, so they are among its tasks; they are returned here in the order the
    compiler lowers them, equal functions merged, weighted by their uses.
    """
    calls = sorted((c, i) for i, task in enumerate(in_call_order) for c in task.planned)
    # A prod is told apart by the rank it reduces, a multiply by the item size: count the uses
    # of each, in the order the compiler first lowers them.
    uses: dict[tuple[str, int], int] = {}
    for _, i in calls:
        for output in _dynamically_allocated_outputs(in_call_order[i].func):
            dtype = tvm.DataType(output.dtype)
            for use in (
                ("prod", len(output.shape)),
                ("multiply", (dtype.bits * dtype.lanes + 7) // 8),
            ):
                uses[use] = uses.get(use, 0) + 1
    tasks = []
    with extraction_scope(target, settings):
        for (op, size), count in uses.items():
            func = _storage_function(op, size)
            lowered = lower_to_te(func, target, NameSupply(""))
            tasks.append(make_task(func, target, lowered, weight=count))
    return tasks


def _storage_function(op: str, size: int) -> relay.Function:
    """``prod`` over a shape vector of ``size`` dims, or ``multiply`` by an item size ``size``."""
    if op == "prod":
        shape = relay.var("shape", shape=(size,), dtype="int64")
        return _fused(shape, relay.prod(shape))
    elements = relay.var("elements", shape=(), dtype="int64")
    return _fused(elements, relay.multiply(elements, relay.const(size, "int64")))


def _dynamically_allocated_outputs(func: relay.Function) -> list[relay.TensorType]:
    """Every output of ``func`` if any has a run-time shape (the VM sizes them all at run
    time), none otherwise; reshape-only functions reuse their input's storage."""
    if (
        func.attrs is not None
        and "relay.reshape_only" in func.attrs.keys()  # noqa: SIM118 (Attrs is no dict)
        and int(func.attrs["relay.reshape_only"])
    ):
        return []
    outputs = flatten_tuple_type(func.ret_type)
    return outputs if any(shape_text(t.shape) for t in outputs) else []


def _fused(param: relay.Var, body: relay.Expr) -> relay.Function:
    """``body`` as FuseOps makes it a primitive function of its own."""
    mod = tvm.IRModule.from_expr(relay.Function([param], body))
    with tvm.transform.PassContext(opt_level=3):
        fused = relay.transform.FuseOps()(relay.transform.InferType()(mod))
    func: relay.Function = fused["main"].body.op  # main calls the one primitive function
    return func


def _structural_hash(expr: Any) -> int:
    return int(tvm.ir.structural_hash(expr)) & (2**64 - 1)


def _labelled(func: relay.Function) -> relay.Function:
    """The function as the VM compiler's ``LabelOps`` pass leaves it, before lowering.

    It adds the function's structural hash (16 hex digits) as ``hash`` and copies every
    layout-named attribute of the calls inside it (the last call's value wins).
    """
    layouts: dict[str, Any] = {}

    def collect(node: Any) -> None:
        if isinstance(node, relay.Call) and node.attrs is not None and hasattr(node.attrs, "keys"):
            for key in node.attrs.keys():  # noqa: SIM118 (Attrs is no dict: no "in")
                value = node.attrs[key]
                if "layout" in key and isinstance(value, (str, tvm.runtime.Object)):
                    layouts[key] = value

    relay.analysis.post_order_visit(func.body, collect)
    labelled = func.with_attr("hash", f"{_structural_hash(func):016x}")
    for key, value in layouts.items():
        labelled = labelled.with_attr(key, value)
    return labelled
