"""Comparisons shared by the equality tests, with messages that show where two lists part."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import hypothesis
import numpy as np
import tvm
from hypothesis.control import currently_in_test_context
from tvm import relay

import relay_tasks
from relay_tasks import RelayTasksError
from relay_tasks.adapters.meta_schedule import extract_task_from_relay
from relay_tasks.ansor import extract_tasks as ansor_extract_tasks
from relay_tasks.autotvm import extract_tasks as autotvm_extract_tasks
from relay_tasks.export import dumps, load_tasks, tasks_document

import oracles
from cuda_schedules import cuda_injective_schedules
from zoo import copy_module

Params = dict[str, "np.ndarray | tvm.nd.NDArray"]


def assert_same_extracted_tasks(expected: list, actual: list) -> None:
    """Same count, names, order, weights; structurally equal relay and dispatched modules."""
    exp_rows = [(t.task_name, int(t.weight)) for t in expected]
    act_rows = [(t.task_name, int(t.weight)) for t in actual]
    assert act_rows == exp_rows, _first_difference(exp_rows, act_rows)
    for exp, act in zip(expected, actual, strict=True):
        assert str(act.target) == str(exp.target), exp.task_name
        assert len(act.dispatched) == len(exp.dispatched), exp.task_name
        for exp_mod, act_mod in zip(exp.dispatched, act.dispatched, strict=True):
            assert tvm.ir.structural_equal(exp_mod, act_mod), f"dispatched TIR of {exp.task_name}"
        assert tvm.ir.structural_equal(exp.mod, act.mod), f"relay function of {exp.task_name}"


def assert_meta_schedule_matches(
    mod: tvm.IRModule, params: Params, target: str, module_equality: str = "structural"
) -> list:
    """Ours equals ``ms.relay_integration.extract_tasks`` on a private copy of the model."""
    expected, actual = _both(
        lambda: oracles.meta_schedule_of(copy_module(mod), _nd(params), target, module_equality),
        lambda: extract_task_from_relay(
            copy_module(mod), target, params, module_equality=module_equality
        ),
        lambda traced, ours: False,
    )
    assert_same_extracted_tasks(expected, actual)
    return actual


def assert_autotvm_matches(mod: tvm.IRModule, params: Params, target: str) -> list:
    """Ours equals ``autotvm.task.extract_from_program``: templates, args, order."""

    def ours() -> list:
        with cuda_injective_schedules():  # around both calls, as upstream needs it on CUDA
            tasks = autotvm_extract_tasks(copy_module(mod), target, params)
        return [(t.name, t.args) for t in tasks]

    expected, actual = _both(
        lambda: oracles.autotvm_tasks_of(copy_module(mod), _nd(params), target),
        ours,
        lambda traced, ours: ours[: len(traced)] == traced,  # both in the compiler's call order
    )
    assert actual == expected, _first_difference(expected, actual)
    return actual


def assert_ansor_matches(
    mod: tvm.IRModule,
    params: Params,
    target: str,
    include_simple_tasks: bool = False,
    *,
    exact_order: bool | None = None,
) -> list:
    """Ours equals ``auto_scheduler.extract_tasks``: workload keys, descriptions, weights, order.

    The order is compared where upstream's is defined (see ``_order_follows_addresses``), or
    where ``exact_order`` says it was measured stable for this model.
    """

    def ours() -> list:
        with cuda_injective_schedules():
            tasks, weights = ansor_extract_tasks(
                copy_module(mod),
                target,
                params,
                hardware_params=oracles.hardware_params(target),
                include_simple_tasks=include_simple_tasks,
            )
        return [(t.workload_key, t.desc, w) for t, w in zip(tasks, weights, strict=True)]

    def upstream() -> list:
        return oracles.ansor_tasks_of(copy_module(mod), _nd(params), target, include_simple_tasks)

    expected, actual = _both(
        upstream,
        ours,
        lambda traced, ours: {r[0] for r in traced} <= {r[0] for r in ours},  # workload keys
    )
    if not exact_order and (exact_order is False or _order_follows_addresses(mod)):
        theirs, ours_ = _unordered(expected), _unordered(actual)
        assert ours_ == theirs, _first_difference(theirs, ours_)
        return actual
    assert actual == expected, _first_difference(expected, actual)
    return actual


def _order_follows_addresses(mod: tvm.IRModule) -> bool:
    """Whether the VM compiler lowers several global functions for ``mod`` (it has more than
    ``main`` that ``main`` uses, or ``main`` binds a local function: a loop, lifted to a global
    one).

    It walks them in the order of the module's TVM map, and its lowering cache (whose iteration
    order is Ansor's task order) fills in that order. Unless that map is a small one (four
    entries at most, made by inserting them), it is ordered by object addresses: upstream's
    Ansor order and ``_N`` name suffixes then change from call to call (measured: one model,
    4 calls in one process, 2 orders). Only the tasks, their weights and their names up to the
    suffix are defined there.
    """
    mod = relay.transform.RemoveUnusedFunctions(["main"])(mod)  # as the pass prefix does
    local: list[relay.Let] = []
    relay.analysis.post_order_visit(
        mod["main"],
        lambda n: (
            local.append(n)
            if isinstance(n, relay.Let) and isinstance(n.value, relay.Function)
            else None
        ),
    )
    return len(mod.functions) > 1 or bool(local)


def _unordered(rows: list) -> list:
    """Ansor rows as a sorted list, each name's ``_N`` suffix dropped."""
    strip = lambda desc: ",".join(re.sub(r"_\d+$", "", name) for name in desc.split(","))  # noqa: E731
    return sorted((key, strip(desc), weight) for key, desc, weight in rows)


def _both(
    upstream: Callable[[], list], ours: Callable[[], list], covers: Callable[[list, list], bool]
) -> tuple[list, list]:
    """Upstream's result and ours, for the caller to compare.

    Where upstream raises, ours must raise one of the package's own errors, or, where upstream
    got as far as tracing tasks before its compile failed (a TE schedule or TIR lowering that
    extraction never needs), return tasks that ``covers`` what upstream had traced; then ours is
    returned twice.
    """
    try:
        expected = upstream()
    except oracles.UpstreamFailed as failure:
        if currently_in_test_context():  # fuzzing: count these apart in the statistics
            hypothesis.event(f"upstream fails: {type(failure.error).__name__}")
        try:
            actual = ours()
        except RelayTasksError:
            return [], []
        assert failure.traced is not None, f"upstream failed ({failure}), ours did not"
        assert covers(failure.traced, actual), (
            f"upstream failed ({failure}) after tracing {failure.traced}; ours: {actual}"
        )
        return actual, actual
    return expected, ours()


def _nd(params: Params) -> dict[str, tvm.nd.NDArray]:
    return {k: v if isinstance(v, tvm.nd.NDArray) else tvm.nd.array(v) for k, v in params.items()}


def _first_difference(expected: list, actual: list) -> str:
    for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
        if e != a:
            return f"first difference at {i}: expected {e}, got {a}"
    return f"expected {len(expected)} tasks, got {len(actual)}"


@contextmanager
def counting_llvm_builds(label=lambda: "") -> Iterator[list[str]]:
    """Record every LLVM build TVM makes (FoldConstant's evaluator compiles each call it folds)."""
    original = tvm.get_global_func("target.build.llvm")
    builds: list[str] = []

    def counting(mod, target):
        builds.append(label())
        return original(mod, target)

    tvm.register_func("target.build.llvm", counting, override=True)
    try:
        yield builds
    finally:
        tvm.register_func("target.build.llvm", original, override=True)


def assert_typed_alike(ours: object, typed: object) -> None:
    """``ours`` is ``typed`` (two functions, or two modules) node for node, and each node has the
    type ``typed``'s has: ``structural_equal`` compares no types."""
    assert tvm.ir.structural_equal(ours, typed)
    if isinstance(typed, tvm.IRModule):
        assert isinstance(ours, tvm.IRModule)
        for gvar, func in typed.functions.items():
            assert_typed_alike(ours[gvar.name_hint], func)
        return
    pairs = zip(_typed_nodes(ours), _typed_nodes(typed), strict=True)
    for a, b in pairs:
        assert tvm.ir.structural_equal(a.checked_type, b.checked_type), (a, b.checked_type)


def _typed_nodes(func: object) -> list:
    nodes: list = []
    relay.analysis.post_order_visit(func, nodes.append)
    return [n for n in nodes if not isinstance(n, tvm.ir.Op)]


def assert_task_file_round_trips(mod: tvm.IRModule, params: Params, target: str) -> None:
    """Each tuner's tasks, written to a task file and read back, are the same rows, and each
    task lowered again from the function the file carries has the key extraction gave it."""
    for tuner in ("meta_schedule", "autotvm", "ansor"):
        tasks = relay_tasks.extract(copy_module(mod), target, params, tuner=tuner)
        document = tasks_document(tasks, tuner=tuner, target=tvm.target.Target(target), models=[])
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "tasks.json"
            path.write_text(dumps(document))
            loaded = load_tasks(path).tasks
        rows = lambda ts: [(t.name, t.weight, t.anchor_op, t.key, t.group) for t in ts]  # noqa: E731
        assert rows(loaded) == rows(tasks), _first_difference(rows(tasks), rows(loaded))


def constant(value: np.ndarray) -> relay.Constant:
    """A constant of exactly this dtype (``relay.const`` turns float64 into float32)."""
    return relay.Constant(tvm.nd.array(np.asarray(value)))


def fold_both(func: relay.Function, *, read: bool = True) -> tuple[tvm.IRModule, tvm.IRModule]:
    """Our fold as the pipeline runs it (deferral allowed, placeholders tracked), with every
    deferred value then computed as reading it would (unless not ``read``), and TVM's."""
    from relay_tasks.optimize.fold import FoldConstant
    from relay_tasks.optimize.placeholders import deferred_placeholders, fill_all

    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    with tvm.transform.PassContext(opt_level=3), deferred_placeholders():
        ours = FoldConstant()(mod)
        if read:
            fill_all()
        return ours, relay.transform.FoldConstant()(mod)


def ops_called(mod: tvm.IRModule) -> list[str]:
    """The operators main calls, in post order (what a rewrite of the loaders left)."""
    names: list[str] = []

    def visit(expr: object) -> None:
        if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
            names.append(expr.op.name)

    relay.analysis.post_order_visit(mod["main"], visit)
    return names
