"""What the VM compiler does between FuseOps and lowering that decides which functions it lowers,
and in what order: the order AutoTVM and Ansor see tasks in, since both extract by compiling.

Before lowering, the compiler plans devices, puts the fused module in A-normal form, lifts local
functions (loop bodies, closures) to global ones and drops dead code; its lowering pass then
visits every global function, in the module's own iteration order, each in evaluation order, and
lowers each call of a primitive function. The same passes run here (cheap: nothing is lowered),
then the same walk. After lowering, its memory planning first drops the global functions ``main``
does not reach, so only calls in the others get storage planned (see :class:`Call`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tvm
from tvm import relay
from tvm.ir import IRModule

from ..errors import ExtractionError
from ..ir import (
    diagnostic_text,
    diagnostics,
    is_optimizable,
    is_primitive_task,
    node_key,
)


class Call(NamedTuple):
    """One call site the VM compiler lowers: the primitive function called, and whether its
    memory planning sees the call. It plans only the global functions ``main`` reaches
    (``RemoveUnusedFunctions`` opens its memory passes), yet it has lowered every one: a
    function whose only caller is unreachable is traced by Ansor but gets no storage-size
    functions."""

    func: relay.Function
    planned: bool


def compiler_calls(fused: IRModule) -> list[Call]:
    """The primitive functions the VM compiler lowers from ``fused``, one per call site."""
    if len(fused.functions) == 1:
        straight = _straight_line_calls(fused["main"])
        if straight is not None:
            return [Call(func, True) for func in straight]
    return calls_after_passes(fused)


def calls_after_passes(fused: IRModule) -> list[Call]:
    """:func:`compiler_calls` the long way: the compiler's own passes, then the walk."""
    transform = relay.transform
    shaped = fused
    with diagnostics() as messages:
        try:
            for step in (
                _plan_devices(),
                transform.ToANormalForm(),
                transform.LambdaLift(),
                transform.DeadCodeElimination(inline_once=False),
            ):
                shaped = step(transform.InferType()(shaped))
        except tvm.TVMError as err:
            raise ExtractionError(
                "TVM's VM compiler, which AutoTVM and Ansor extract with, rejects the model "
                f"after fusion: {diagnostic_text(messages, err)} (upstream's extraction fails "
                "here too; MetaSchedule, which walks main only, can still extract it)"
            ) from err
    reached = _reached_from_main(shaped)
    called: list[Call] = []
    for var, func in shaped.functions.items():
        if isinstance(func, relay.Function) and is_optimizable(func):
            called += [Call(f, var.name_hint in reached) for f in _calls_in(func)]
    return called


def _reached_from_main(mod: IRModule) -> set[str]:
    """The names of the global functions ``main`` refers to, directly or through others."""
    reached, todo = set(), ["main"]
    while todo:
        name = todo.pop()
        if name in reached or name not in [v.name_hint for v in mod.get_global_vars()]:
            continue
        reached.add(name)
        relay.analysis.post_order_visit(
            mod[name],
            lambda node: todo.append(node.name_hint) if isinstance(node, relay.GlobalVar) else None,
        )
    return reached


def _straight_line_calls(main: relay.Function) -> list[relay.Function] | None:
    """The calls of a ``main`` without control flow or local functions, in post order; None
    if it has any.

    Such a function is all dataflow: every node is live, A-normal form binds the calls in post
    order, and there is nothing to lift, so the compiler's passes would not change the order.
    Skipping them saves about 0.3 s on ResNet-50 (device planning and type inference).
    """
    called: list[relay.Function] = []
    control = False

    def visit(node: Any) -> None:
        nonlocal control
        if isinstance(node, (relay.If, relay.Match, relay.Let)):
            control = True
        elif isinstance(node, relay.Function) and not node.same_as(main):
            control = control or not is_primitive_task(node)
        else:
            _collect_call(node, {}, called)

    relay.analysis.post_order_visit(main, visit)
    return None if control else called


def _plan_devices() -> tvm.transform.Pass:
    """The compiler's device planning for the current target. It annotates only, on one device,
    but it rebuilds the module, and so the order its functions iterate in. (hhb-tvm's Python
    wrapper of the pass is broken, hence the registered function.)"""
    config = tvm.target.make_compilation_config(
        tvm.transform.PassContext.current(), tvm.target.Target.current()
    )
    return tvm.get_global_func("relay._transform.PlanDevices")(config)


def _calls_in(func: relay.Function) -> list[relay.Function]:
    """Calls of primitive functions in ``func``, in evaluation order; A-normal form binds each
    function to a variable before calling it."""
    bound: dict[int, relay.Function] = {}

    def bind(node: Any) -> None:
        if isinstance(node, relay.Let) and isinstance(node.value, relay.Function):
            bound[node_key(node.var)] = node.value

    relay.analysis.post_order_visit(func, bind)
    called: list[relay.Function] = []
    relay.analysis.post_order_visit(func, lambda node: _collect_call(node, bound, called))
    return called


def _collect_call(
    node: Any, bound: dict[int, relay.Function], called: list[relay.Function]
) -> None:
    """Append the primitive function ``node`` calls, directly or through a variable ``bound``
    to it, to ``called``."""
    if not isinstance(node, relay.Call):
        return
    op = node.op
    if isinstance(op, relay.Var):
        op = bound.get(node_key(op))
    if isinstance(op, relay.Function) and is_primitive_task(op):
        called.append(op)
