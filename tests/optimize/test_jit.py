"""TVM's kernels for what numpy leaves: TVM's own values, bit for bit, from one build."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relay

from relay_tasks.adapters.meta_schedule import extract_task_from_relay
from relay_tasks.optimize import jit
from relay_tasks.optimize.jit import FOLD_TARGET, Kernels, constant_leaves

from checks import assert_meta_schedule_matches, constant, counting_llvm_builds
from zoo import HOST

_FOLD = tvm.get_global_func("relay._transform.FoldConstantExpr")


def _calls() -> list[relay.Call]:
    """Calls TVM's fold evaluates and numpy does not: transcendental ops, a product of
    constants, a float-to-integer cast out of range, a tuple argument, a reduction."""
    rng = np.random.default_rng(0)
    x = constant(rng.uniform(0.01, 100, (16, 32)).astype("float32"))
    freqs = constant(rng.standard_normal((1, 16, 1)).astype("float32"))
    steps = constant(np.arange(128, dtype="float32").reshape(1, 1, 128))
    wide = constant(np.array([1e10, -1e10, np.inf, 3.5], "float32"))
    return [
        relay.log(x),
        relay.cos(x),
        relay.sin(x),
        relay.exp(x),
        relay.tanh(x),
        relay.erf(x),
        relay.sigmoid(x),
        relay.nn.batch_matmul(freqs, steps, transpose_b=False),
        relay.cast(wide, "int32"),
        relay.concatenate([x, x], 1),
        relay.sum(x, axis=1),
    ]


def _same_bits(ours: Any, theirs: np.ndarray) -> bool:
    ours = ours.numpy()
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[ours.dtype.itemsize]
    return ours.shape == theirs.shape and np.array_equal(ours.view(width), theirs.view(width))


def test_kernels_give_tvms_values_from_one_build() -> None:
    calls = _calls()
    kernels = Kernels()
    indices = [kernels.add(call) for call in calls]
    with counting_llvm_builds() as builds:
        values = [
            kernels.run(i, [c.data for c in constant_leaves(call.args)])
            for i, call in zip(indices, calls, strict=True)
        ]
    assert len(builds) == kernels.builds == 1
    for call, value in zip(calls, values, strict=True):
        assert _same_bits(value, _FOLD(call, tvm.IRModule(), False).data.numpy()), call.op.name


def test_a_kernel_added_after_the_build_is_built_then() -> None:
    first, second = _calls()[:2]
    kernels = Kernels()
    kernels.run(kernels.add(first), [c.data for c in constant_leaves(first.args)])
    value = kernels.run(kernels.add(second), [c.data for c in constant_leaves(second.args)])
    assert kernels.builds == 2
    assert _same_bits(value, _FOLD(second, tvm.IRModule(), False).data.numpy())


def test_the_kernels_are_the_ones_tvms_fold_builds() -> None:
    """Each kernel's TIR equals the one TVM's fold of the call alone builds, for the target
    it builds for (hhb-tvm's, not the plain ``llvm`` of upstream's source)."""
    built: list[tuple[str, tvm.IRModule]] = []
    original = tvm.get_global_func("relay.backend.build")

    def recording(mod: tvm.IRModule, target: Any, target_host: Any = None) -> Any:
        built.append((str(target), mod))
        return original(mod, target, target_host)

    calls = _calls()
    tvm.register_func("relay.backend.build", recording, override=True)
    try:
        for call in calls:
            _FOLD(call, tvm.IRModule(), False)
        theirs = list(built)
        built.clear()
        kernels = Kernels()
        for index, call in [(kernels.add(call), call) for call in calls]:
            kernels.run(index, [c.data for c in constant_leaves(call.args)])
    finally:
        tvm.register_func("relay.backend.build", original, override=True)
    assert {target for target, _ in theirs} == {str(tvm.target.Target(FOLD_TARGET))}
    ((_, ours),) = built
    ours_funcs = list(ours.functions.values())
    for _, mod in theirs:
        (func,) = mod.functions.values()
        assert any(tvm.ir.structural_equal(func, f, map_free_vars=True) for f in ours_funcs)


def test_a_call_the_batch_cannot_lower_is_folded_by_tvm_alone(monkeypatch) -> None:
    def broken(functions: Any) -> Any:
        raise tvm.TVMError("lowering failed")

    monkeypatch.setattr(jit, "_lowered", broken)
    call = _calls()[0]
    kernels = Kernels()
    value = kernels.run(kernels.add(call), [c.data for c in constant_leaves(call.args)])
    assert kernels.builds == 0
    assert _same_bits(value, _FOLD(call, tvm.IRModule(), False).data.numpy())


def test_what_tvm_never_evaluates_is_not_a_kernel() -> None:
    assert jit.evaluated_by_tvm(relay.op.get("log"))
    for name in ("shape_of", "device_copy", "on_device"):
        assert not jit.evaluated_by_tvm(relay.op.get(name)), name


def _rotary_and_buckets() -> tuple[tvm.IRModule, dict[str, Any]]:
    """A model whose constant subgraphs need TVM's kernels: T5's relative position buckets
    (``log``, casts, ``minimum``, ``where``) added to attention scores, and rotary tables
    (``cos``, ``sin`` of a product of constants)."""
    n, buckets, max_exact = 16, 8, 4
    positions = np.arange(n, dtype="int64")
    relative = constant(positions[None, :] - positions[:, None])
    distance = relay.abs(relative)
    scaled = relay.log(relay.cast(distance, "float32") / relay.const(float(max_exact)))
    large = relay.cast(scaled * relay.const(2.0), "int64") + relay.const(max_exact, "int64")
    large = relay.minimum(large, relay.full_like(large, relay.const(buckets - 1, "int64")))
    bucket = relay.where(relay.less(distance, relay.const(max_exact, "int64")), distance, large)
    table = constant(np.random.default_rng(1).standard_normal((buckets, 4)).astype("float32"))
    bias = relay.transpose(relay.take(table, bucket, axis=0), [2, 0, 1])
    freqs = constant(np.linspace(0.1, 1.0, 8, dtype="float32").reshape(1, 8, 1))
    steps = constant(np.arange(n, dtype="float32").reshape(1, 1, n))
    angles = relay.transpose(relay.nn.batch_matmul(freqs, steps, transpose_b=False), [0, 2, 1])
    x = relay.var("x", shape=(4, n, n))
    q = relay.var("q", shape=(1, n, 8))
    rotated = q * relay.cos(angles) + q * relay.sin(angles)
    return tvm.IRModule.from_expr(relay.Function([x, q], relay.Tuple([x + bias, rotated]))), {}


def test_an_extraction_builds_nothing_that_nothing_reads() -> None:
    """Upstream's fold builds every call of both tables; here they are arguments of fused
    functions, read by no task: nothing is built, and the tasks are upstream's."""
    mod, params = _rotary_and_buckets()
    with counting_llvm_builds() as builds:
        extract_task_from_relay(mod, HOST, params)
    assert builds == []
    with counting_llvm_builds() as upstream_and_ours:
        assert_meta_schedule_matches(*_rotary_and_buckets(), HOST)
    assert len(upstream_and_ours) >= 10  # upstream's fold: one build per call of the tables


@pytest.mark.parametrize("fused", [True, False], ids=["scalar-in-a-task", "values-read"])
def test_values_read_are_computed_in_one_build(fused: bool, monkeypatch) -> None:
    """A kernel's result that ends inside a fused function (a scalar), or whose values a pass
    reads (here: every value, as with params linked), is computed; one build for all."""
    x = relay.var("x", shape=(4,))
    scale = relay.log(relay.const(np.float32(3.0)))  # a scalar: FuseOps keeps it inside
    table = relay.cos(constant(np.linspace(0, 1, 4, dtype="float32")))
    mod = tvm.IRModule.from_expr(relay.Function([x], x * scale + table))
    if not fused:
        from relay_tasks.optimize import fold

        monkeypatch.setattr(fold, "links_params", lambda mod, ctx: True)
    with counting_llvm_builds() as builds:
        extract_task_from_relay(mod, HOST, {})
    assert len(builds) == 1
    assert_meta_schedule_matches(mod, {}, HOST)
