"""Inputs real models bring beyond the zoo, each with a defined answer: upstream's, for every tuner."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tvm
from tvm import relay

import relay_tasks
from relay_tasks import (
    ExtractionError,
    ModelError,
    SkippedTaskWarning,
    autotvm,
)

import oracles
from checks import assert_ansor_matches, assert_autotvm_matches, assert_meta_schedule_matches
from small_graphs import partitioned_for_ccompiler
from zoo import AARCH64, CUDA, X86, copy_module

Model = tuple[tvm.IRModule, dict[str, np.ndarray]]
RNG = np.random.default_rng(11)


def _module(*outputs: relay.Expr) -> tvm.IRModule:
    body = outputs[0] if len(outputs) == 1 else relay.Tuple(list(outputs))
    return tvm.IRModule.from_expr(relay.Function(relay.analysis.free_vars(body), body))


def no_operators() -> Model:
    """Inputs straight to outputs: nothing to tune."""
    x, y = relay.var("x", shape=(2, 3)), relay.var("y", shape=(4,))
    return _module(y, x), {}


def layout_changes_only() -> Model:
    data = relay.var("data", shape=(1, 8, 6, 6))
    out = relay.layout_transform(data, "NCHW", "NHWC")
    out = relay.transpose(out, (0, 3, 1, 2))
    out = relay.reshape(out, (1, 8, 36))
    out = relay.expand_dims(relay.squeeze(relay.expand_dims(out, 0), [0]), 1)
    return _module(relay.layout_transform(relay.reshape(out, (1, 8, 6, 6)), "NCHW", "NCHW4c")), {}


def _q(value: float, dtype: str = "float32") -> relay.Expr:
    return relay.const(value, dtype)


def qnn_int8() -> Model:
    """Quantize, qnn.conv2d, requantize, qnn.dense, dequantize: what a quantized TFLite net holds."""
    data = relay.var("data", shape=(1, 8, 12, 12))
    zero = relay.const(0, "int32")
    q = relay.qnn.op.quantize(data, _q(0.05), zero, out_dtype="int8")
    w = relay.const(RNG.integers(-127, 127, (16, 8, 3, 3)).astype("int8"))
    conv = relay.qnn.op.conv2d(
        q, w, zero, zero, _q(0.05), _q(0.02), kernel_size=(3, 3), channels=16, padding=(1, 1)
    )
    conv = relay.nn.bias_add(conv, relay.const(RNG.integers(-100, 100, (16,)).astype("int32")))
    rq = relay.qnn.op.requantize(conv, _q(0.001), zero, _q(0.05), zero, out_dtype="int8")
    flat = relay.reshape(rq, (1, -1))
    wd = relay.const(RNG.integers(-127, 127, (10, 16 * 12 * 12)).astype("int8"))
    dense = relay.qnn.op.dense(flat, wd, zero, zero, _q(0.05), _q(0.01), units=10)
    out = relay.qnn.op.requantize(dense, _q(0.0005), zero, _q(0.1), zero, out_dtype="int8")
    return _module(relay.qnn.op.dequantize(out, _q(0.1), zero)), {}


def float16_network() -> Model:
    data = relay.var("data", shape=(1, 8, 16, 16), dtype="float16")
    w = relay.var("w", shape=(16, 8, 3, 3), dtype="float16")
    wd = relay.var("wd", shape=(10, 16), dtype="float16")
    out = relay.nn.relu(relay.nn.conv2d(data, w, padding=(1, 1), channels=16, kernel_size=(3, 3)))
    out = relay.nn.batch_flatten(relay.nn.global_avg_pool2d(out))
    out = relay.nn.softmax(relay.nn.dense(out, wd) * relay.const(0.5, "float16"))
    params = {
        "w": RNG.standard_normal((16, 8, 3, 3)).astype("float16"),
        "wd": RNG.standard_normal((10, 16)).astype("float16"),
    }
    return _module(out), params


MODELS: dict[str, Callable[[], Model]] = {
    f.__name__: f
    for f in (
        no_operators,
        layout_changes_only,
        qnn_int8,
        float16_network,
        partitioned_for_ccompiler,
    )
}
#: Ops each model must show in its MetaSchedule task names, so no row passes on two empty lists.
MUST_SHOW = {
    "no_operators": (),
    "layout_changes_only": ("layout_transform",),
    "qnn_int8": ("conv2d", "dense"),
    "float16_network": ("conv2d", "dense", "softmax"),
    "partitioned_for_ccompiler": ("conv2d",),
}
ROWS = [
    pytest.param(m, t, id=f"{m}-{tn}") for m in MODELS for tn, t in (("x86", X86), ("cuda", CUDA))
]


@pytest.mark.parametrize(("model", "target"), ROWS)
def test_meta_schedule(model: str, target: str) -> None:
    tasks = assert_meta_schedule_matches(*MODELS[model](), target)
    names = " ".join(t.task_name for t in tasks)
    assert all(op in names for op in MUST_SHOW[model]), names
    assert bool(tasks) == bool(MUST_SHOW[model])


@pytest.mark.parametrize(("model", "target"), ROWS)
def test_autotvm(model: str, target: str) -> None:
    assert_autotvm_matches(*MODELS[model](), target)


@pytest.mark.parametrize("simple", [False, True], ids=["complex-only", "with-simple"])
@pytest.mark.parametrize(("model", "target"), ROWS)
def test_ansor(model: str, target: str, simple: bool) -> None:
    assert_ansor_matches(*MODELS[model](), target, simple)


def dynamic_batch() -> Model:
    """Every op on a relay.Any() batch dimension."""
    data = relay.var("data", shape=(relay.Any(), 16))
    w = relay.var("w", shape=(8, 16))
    out = relay.nn.relu(relay.nn.dense(data, w))
    return _module(out), {"w": RNG.standard_normal((8, 16)).astype("float32")}


def partly_dynamic() -> Model:
    """A static convolution next to an op on a dynamic input, as detection heads have."""
    x = relay.var("x", shape=(1, 3, 8, 8))
    w = relay.var("w", shape=(8, 3, 3, 3))
    conv = relay.nn.relu(relay.nn.conv2d(x, w, padding=(1, 1), channels=8, kernel_size=(3, 3)))
    boxes = relay.exp(relay.var("boxes", shape=(relay.Any(), 4)))
    return _module(conv, boxes), {"w": RNG.standard_normal((8, 3, 3, 3)).astype("float32")}


@pytest.mark.parametrize("target", [X86, CUDA])
def test_dynamic_functions_are_left_out_of_meta_schedule_as_upstream_does(target: str) -> None:
    with pytest.warns(
        SkippedTaskWarning, match=r"fused_nn_dense_nn_relu has the dynamic shape \(\?, 16\)"
    ):
        assert assert_meta_schedule_matches(*dynamic_batch(), target) == []
    with pytest.warns(SkippedTaskWarning, match=r"fused_exp has the dynamic shape \(\?, 4\)"):
        tasks = assert_meta_schedule_matches(*partly_dynamic(), target)
    assert any("conv2d" in t.task_name for t in tasks)


def test_autotvm_names_the_dynamic_shape_where_upstream_fails() -> None:
    mod, params = dynamic_batch()
    with pytest.raises(oracles.UpstreamFailed):  # whatever the template hits
        oracles.autotvm_tasks_of(copy_module(mod), params, X86)
    with pytest.raises(
        ModelError,
        match=r"dense_pack.x86 task of fused_nn_dense_nn_relu: its shape \(\?, 16\) is dynamic",
    ):
        autotvm.extract_tasks(mod, X86, params)
    # A dynamic op without a template does not stop AutoTVM: the same tasks as upstream.
    assert assert_autotvm_matches(*partly_dynamic(), X86)


def dynamic_image_size() -> Model:
    """Dynamic height and width: on x86 the NCHWc layout adds dynamic 5-d tensors."""
    data = relay.var("data", shape=(1, 3, relay.Any(), relay.Any()))
    w = relay.var("w", shape=(8, 3, 3, 3))
    out = relay.nn.relu(relay.nn.conv2d(data, w, padding=(1, 1), channels=8, kernel_size=(3, 3)))
    return _module(out), {"w": RNG.standard_normal((8, 3, 3, 3)).astype("float32")}


def dynamic_tuple_of_dtypes() -> Model:
    """A dynamic function with two outputs of different item sizes (float16, float32)."""
    data = relay.var("data", shape=(relay.Any(), 8), dtype="float16")
    left, right = relay.split(data, 2, axis=1)
    return _module(relay.exp(left), relay.cast(right, "float32") * relay.const(2.0)), {}


DYNAMIC = [dynamic_batch, partly_dynamic, dynamic_image_size, dynamic_tuple_of_dtypes]


def test_autotvm_names_a_dynamic_shape_a_layout_hook_traced() -> None:
    """Found by the fuzzer: on arm_cpu the conv2d legalize hook instantiates the template
    during the passes, on the dynamic shape, before any function exists to name."""
    data, w = relay.var("data", shape=(relay.Any(), 4, 6, 6)), relay.var("w", shape=(4, 4, 1, 1))
    mod = _module(relay.nn.conv2d(data, w, channels=4, kernel_size=(1, 1)))
    params = {"w": RNG.standard_normal((4, 4, 1, 1)).astype("float32")}
    with pytest.raises(oracles.UpstreamFailed):
        oracles.autotvm_tasks_of(copy_module(mod), params, AARCH64)
    with pytest.raises(ModelError, match=r"arm_cpu task: its shape \(\?, 4, 6, 6\) is dynamic"):
        autotvm.extract_tasks(mod, AARCH64, params)


@pytest.mark.parametrize("simple", [False, True], ids=["complex-only", "with-simple"])
@pytest.mark.parametrize("target", [X86, CUDA])
@pytest.mark.parametrize("model", DYNAMIC, ids=[m.__name__ for m in DYNAMIC])
def test_ansor_on_dynamic_shapes_equals_upstream(model, target: str, simple: bool) -> None:
    """Upstream's Ansor extraction leaves dynamic functions out too, but compiles the model, so
    its tasks include the VM's storage-size computations for them: ``prod`` over each dynamic
    output's shape vector, then ``multiply`` by the item size. Ours has the same tasks."""
    with pytest.warns(SkippedTaskWarning, match="dynamic shape"):
        tasks = assert_ansor_matches(*model(), target, simple)
    assert any(desc.startswith("vm_mod_fused_prod") for _, desc, _ in tasks)


@pytest.mark.parametrize("target", [X86, CUDA])
def test_ansor_keeps_a_function_that_reads_only_a_dynamic_inputs_shape(target: str) -> None:
    """shape_of of a (?, 28, 28) input: its compute reads no tensor, only the shape, and its
    output is static, so upstream's Ansor extraction (and its own test) makes a task of it."""
    mod = _module(relay.shape_of(relay.var("data", shape=(relay.Any(), 28, 28))))
    tasks = assert_ansor_matches(mod, {}, target, True)
    assert [desc for _, desc, _ in tasks] == ["vm_mod_fused_shape_of"]


def _conv2d_1x1_nhwc(data_shape: tuple, kernel_shape: tuple, kernel_layout: str) -> Model:
    data, w = relay.var("data", shape=data_shape), relay.var("w", shape=kernel_shape)
    channels = kernel_shape[kernel_layout.index("O")]
    out = relay.nn.conv2d(
        data,
        w,
        channels=channels,
        kernel_size=(1, 1),
        data_layout="NHWC",
        kernel_layout=kernel_layout,
    )
    return _module(out), {"w": RNG.standard_normal(kernel_shape).astype("float32")}


def nhwc_conv2d() -> Model:
    return _conv2d_1x1_nhwc((1, 6, 6, 4), (1, 1, 4, 8), "HWIO")


def nhwc_conv2d_with_hwoi_kernel() -> Model:
    """One input channel, groups=1, but a depthwise kernel layout: x86's strategy asserts."""
    return _conv2d_1x1_nhwc((4, 6, 6, 1), (1, 1, 1, 1), "HWOI")


def dense_plus_itself() -> Model:
    """SimplifyExpr rewrites y + y to y * 2 and then trips over a free variable (a TVM bug)."""
    data, w = relay.var("data", shape=(1, 16)), relay.var("w", shape=(4, 16))
    dense = relay.nn.dense(data, w)
    return _module(dense + dense), {"w": RNG.standard_normal((4, 16)).astype("float32")}


def zero_over_zero() -> Model:
    """(s - s) / (s - s): TIR's constant folder sees 0 / 0 when the compiler lowers it."""
    s = relay.nn.softmax(relay.var("data", shape=(2, 4, 8)))
    return _module((s - s) / (s - s)), {}


@pytest.mark.parametrize(
    ("model", "target", "message"),
    [
        # Found by the fuzzer, on every target and tuner.
        (
            dense_plus_itself,
            X86,
            "TVM failed to optimise the model for llvm: contains free variables",
        ),
        # Found by the fuzzer: hhb-tvm's arm_cpu conv2d alter-layout hook calls
        # contrib_conv2d_gemm_weight_transform without its kernel_layout argument.
        (
            nhwc_conv2d,
            AARCH64,
            "TVM failed to optimise the model for llvm: contrib_conv2d_gemm_weight_transform",
        ),
        # Found by the fuzzer: a bare assert in conv2d_strategy_cpu, an error without a message.
        (
            nhwc_conv2d_with_hwoi_kernel,
            X86,
            r"TVM failed to optimise the model for llvm: AssertionError in conv2d_strategy_cpu \(x86.py:\d+\)",
        ),
    ],
    ids=["dense-plus-itself-x86", "nhwc-conv2d-aarch64", "nhwc-hwoi-groups-1-x86"],
)
def test_where_upstream_fails_ours_is_one_extraction_error(model, target, message) -> None:
    mod, params = model()
    assert assert_meta_schedule_matches(mod, params, target) == []  # upstream raised, ours too
    assert assert_ansor_matches(mod, params, target) == []
    assert_autotvm_matches(mod, params, target)  # AutoTVM's extraction skips AlterOpLayout
    with pytest.raises(ExtractionError, match=message):
        relay_tasks.extract_tasks(mod, target, params)


@pytest.mark.parametrize("target", [X86, CUDA, AARCH64])
def test_a_compile_failure_after_tracing_does_not_stop_ours(target: str) -> None:
    """Found by the fuzzer: upstream's Ansor extraction compiles the model, and lowering this
    function to TIR divides by zero, so it raises although it had traced the task. Ours never
    lowers to TIR and returns that task."""
    mod, params = zero_over_zero()
    with pytest.raises(oracles.UpstreamFailed, match="Divide by zero") as upstream:
        oracles.ansor_tasks_of(copy_module(mod), params, target, True)
    assert upstream.value.traced
    assert assert_ansor_matches(mod, params, target, True) == upstream.value.traced
    assert assert_meta_schedule_matches(mod, params, target)  # MetaSchedule never compiles
