"""Run a Relay pass on the neighbourhood of a few calls instead of on the whole function.

TVM's pattern-rewriting passes (``SimplifyExpr`` and its kin) re-infer the types of the whole
function and rebuild its graph index once per rewrite per round, so on a transformer a pass that
rewrites one ``add`` costs 2 s. Here the calls around the flagged ones are cut out into a small
function, the real pass runs on it, and its result is spliced back. The cut keeps what a pattern
can observe: constants stay constants, every cut-off input becomes a variable of the same type
(one per input, so shared inputs stay shared), and every cut node that is also used outside the
cut is an output, so a match that would have swallowed a node other calls still need is refused
inside the cut as it is in the whole graph. A cut hides structure, never adds it: a pattern that
matches in the cut matches in the whole graph, and one that needs what was cut away is missed
here and left for the caller to notice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import tvm
from tvm import relay

from ..ir import node_key, raw_data, reads_of, rebuild, with_children
from .placeholders import buffer_address

PassOnModule = Callable[[tvm.IRModule], tvm.IRModule]

#: How deep below a flagged call the cut reaches: the deepest pattern of the passes screened
#: here (``cast(clip(cast(x)))``, the binomial squares) spans four calls from its root.
BELOW = 4
#: How far above: a rewrite often enables another at its user (a reshape whose argument became
#: a reshape); taking users in finishes that in the same run instead of another round.
ABOVE = 2

#: The nodes of a dataflow graph that compute something (the rest are leaves).
COMPUTED = (relay.Call, relay.Tuple, relay.TupleGetItem)


def run_on_region(
    func: relay.Function, flagged: Iterable[relay.Call], run_pass: PassOnModule
) -> relay.Function | None:
    """``func`` with ``run_pass`` applied to the neighbourhood of the ``flagged`` calls.

    None when the cut cannot stand in for the whole function (control flow, calls of anything
    but operators) or when the pass leaves the cut unchanged: a flagged call it did not rewrite
    may have been refused for lack of context, so the caller lets the pass see everything.
    """
    graph = _Graph(func)
    if not graph.dataflow_only:
        return None
    region = graph.region([node_key(c) for c in flagged])
    outputs = [k for k in graph.order if k in region and graph.escapes(k, region)]
    cut, inputs = _cut(graph, region)
    body = relay.Tuple([cut[k] for k in outputs])
    small = relay.Function(relay.analysis.free_vars(body), body)
    typed = relay.transform.InferType()(tvm.IRModule.from_expr(small))
    done = run_pass(typed)["main"]
    if tvm.ir.structural_equal(done, typed["main"], map_free_vars=True):
        return None
    if not isinstance(done.body, relay.Tuple) or len(done.body.fields) != len(outputs):
        return None
    cut_of = {node_key(var): key for key, var in inputs.items()}
    origins: dict[int, int | relay.Expr] = {
        node_key(new): cut_of.get(node_key(old), old)
        for new, old in zip(done.params, small.params, strict=True)
    }
    origins.update(_constants_kept(small, done))
    return _splice(graph, region, dict(zip(outputs, done.body.fields, strict=True)), origins)


def _constants_kept(before: relay.Function, after: relay.Function) -> dict[int, relay.Constant]:
    """The constants of the pass's result that are constants of the cut, copied: TVM's passes
    rebuild each Constant node around the same array. Each is placed as the model's own node, so
    a constant the cut shares with calls outside it stays one object, as the pass on the whole
    function keeps it (FuseOps makes one parameter of one object, two of two equal ones). An
    array two of the cut's constants hold is left alone: which one a copy stands for is lost."""
    originals: dict[tuple[Any, ...], list[relay.Constant]] = {}
    for const in _constants(before):
        found = originals.setdefault(_array_of(const), [])
        if not any(const.same_as(other) for other in found):
            found.append(const)
    kept: dict[int, relay.Constant] = {}
    for const in _constants(after):
        found = originals.get(_array_of(const), [])
        if len(found) == 1 and _array_of(const)[0]:  # an empty array has no address
            kept[node_key(const)] = found[0]
    return kept


def _array_of(const: relay.Constant) -> tuple[Any, ...]:
    data = raw_data(const)
    return buffer_address(data), tuple(data.shape), str(data.dtype)


def _constants(func: relay.Function) -> list[relay.Constant]:
    found: list[relay.Constant] = []
    relay.analysis.post_order_visit(
        func, lambda node: found.append(node) if isinstance(node, relay.Constant) else None
    )
    return found


class _Graph:
    """One function's dataflow graph: nodes in post order, and the users of each."""

    def __init__(self, func: relay.Function) -> None:
        self.func = func
        self.nodes: dict[int, Any] = {}
        self.order: list[int] = []
        self.users: dict[int, list[int]] = {}
        self.child_keys: dict[int, list[int]] = {}
        self.dataflow_only = True
        self.reads = reads_of(func)
        for node in self.reads.nodes:
            self._add(node)

    def _add(self, node: Any) -> None:
        key = node_key(node)
        self.nodes[key] = node
        self.order.append(key)
        kids = self.reads.children(node) or []
        self.child_keys[key] = [node_key(child) for child in kids]
        for child in self.child_keys[key]:
            self.users.setdefault(child, []).append(key)
        if isinstance(node, relay.Call) and not isinstance(kids[0], tvm.ir.Op):
            self.dataflow_only = False
        elif not isinstance(node, (*COMPUTED, relay.Var, relay.Constant, tvm.ir.Op)):
            self.dataflow_only &= node.same_as(self.func)  # no Let, If, Match, inner function

    def inner(self, key: int) -> bool:
        return isinstance(self.nodes.get(key), COMPUTED)

    def _below(self, key: int) -> list[int]:
        return [k for k in self.child_keys[key] if self.inner(k)]

    def _above(self, key: int) -> list[int]:
        return [k for k in self.users.get(key, ()) if self.inner(k)]

    def region(self, seeds: list[int]) -> set[int]:
        """The seeds and the nodes a few steps below and above them."""
        region = set(seeds)
        for step, depth in ((self._below, BELOW), (self._above, ABOVE)):
            frontier = list(seeds)
            for _ in range(depth):
                frontier = [k for node in frontier for k in step(node) if k not in region]
                region.update(frontier)
        return region

    def escapes(self, key: int, region: set[int]) -> bool:
        """Whether something outside ``region`` (the function itself included) uses ``key``."""
        return any(user not in region for user in self.users.get(key, ()))


def _cut(graph: _Graph, region: set[int]) -> tuple[dict[int, Any], dict[int, relay.Var]]:
    """The region's nodes rebuilt over typed variables for its cut-off inputs, and those
    variables by the key of the node each stands for."""
    memo: dict[int, Any] = {}
    inputs: dict[int, relay.Var] = {}

    def get(child: Any) -> Any:
        key = node_key(child)
        if key in memo:
            return memo[key]
        if not graph.inner(key):
            return child  # constants, the function's own variables, operators
        if key not in inputs:
            inputs[key] = relay.var(f"cut{len(inputs)}", type_annotation=child.checked_type)
        return inputs[key]

    for key in graph.order:
        if key in region:
            memo[key] = rebuild(graph.nodes[key], get)
    return memo, inputs


def _splice(
    graph: _Graph, region: set[int], outputs: dict[int, Any], origins: dict[int, int | relay.Expr]
) -> relay.Function:
    """The whole function again, each region output replaced by the pass's result for it.

    One walk in post order: a node outside the region is rebuilt over its children's new forms;
    a region output is the pass's result with each cut variable replaced by the new form of the
    node it stands for, which lies below the output and so is already built. One memo for all
    results keeps what they share shared.
    """
    new: dict[int, Any] = {}
    placed: dict[int, Any] = {}

    def get_placed(child: Any) -> Any:
        return placed.get(node_key(child), child)

    def place(result: Any) -> Any:
        nodes: list[Any] = []
        relay.analysis.post_order_visit(result, nodes.append)
        for node in nodes:
            key = node_key(node)
            if key in placed:
                continue
            origin = origins.get(key)
            if isinstance(origin, int):
                placed[key] = new[origin]
            elif origin is not None:
                placed[key] = origin
            else:
                placed[key] = rebuild(node, get_placed)
        return placed[node_key(result)]

    for key in graph.order:
        if key in outputs:
            new[key] = place(outputs[key])
        elif key not in region:
            node, kids = graph.nodes[key], graph.child_keys[key]
            changed = any(new[c] is not graph.nodes[c] for c in kids)
            new[key] = with_children(node, [new[c] for c in kids]) if changed else node
    func = new[node_key(graph.func)]
    assert isinstance(func, relay.Function)
    return func
