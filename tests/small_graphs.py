"""Small hand-built Relay graphs, one per pattern the backend must get right.

Each builder returns ``(IRModule, params)`` with seeded weights, so every run sees the same model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relay

Workload = tuple[tvm.IRModule, dict[str, tvm.nd.NDArray]]


def _weights(rng: np.random.Generator, **shapes: tuple[int, ...]) -> dict[str, tvm.nd.NDArray]:
    return {
        name: tvm.nd.array(rng.standard_normal(shape).astype("float32"))
        for name, shape in shapes.items()
    }


def _module(out: relay.Expr) -> tvm.IRModule:
    func = relay.Function(relay.analysis.free_vars(out), out)
    return tvm.IRModule.from_expr(func)


def conv_bias_bn_relu() -> Workload:
    rng = np.random.default_rng(1)
    data = relay.var("data", shape=(1, 16, 28, 28))
    out = data
    params: dict[str, tvm.nd.NDArray] = {}
    for i, channels in enumerate((32, 32, 64)):
        in_ch = 16 if i == 0 else 32
        w = relay.var(f"w{i}", shape=(channels, in_ch, 3, 3))
        b = relay.var(f"b{i}", shape=(channels,))
        gamma, beta = (
            relay.var(f"gamma{i}", shape=(channels,)),
            relay.var(f"beta{i}", shape=(channels,)),
        )
        mean, var = (
            relay.var(f"mean{i}", shape=(channels,)),
            relay.var(f"var{i}", shape=(channels,)),
        )
        out = relay.nn.conv2d(out, w, padding=(1, 1), channels=channels, kernel_size=(3, 3))
        out = relay.nn.bias_add(out, b)
        out = relay.nn.batch_norm(out, gamma, beta, mean, var)[0]
        out = relay.nn.relu(out)
        params.update(
            _weights(
                rng,
                **{
                    f"w{i}": (channels, in_ch, 3, 3),
                    f"b{i}": (channels,),
                    f"gamma{i}": (channels,),
                    f"beta{i}": (channels,),
                    f"mean{i}": (channels,),
                },
            )
        )
        params[f"var{i}"] = tvm.nd.array(rng.uniform(0.5, 2.0, (channels,)).astype("float32"))
    return _module(out), params


def depthwise_conv() -> Workload:
    rng = np.random.default_rng(2)
    data = relay.var("data", shape=(1, 32, 56, 56))
    w_dw = relay.var("w_dw", shape=(32, 1, 3, 3))
    w_pw = relay.var("w_pw", shape=(64, 32, 1, 1))
    out = relay.nn.conv2d(data, w_dw, padding=(1, 1), groups=32, channels=32, kernel_size=(3, 3))
    out = relay.nn.relu(out)
    out = relay.nn.conv2d(out, w_pw, channels=64, kernel_size=(1, 1))
    out = relay.clip(out, 0.0, 6.0)
    return _module(out), _weights(rng, w_dw=(32, 1, 3, 3), w_pw=(64, 32, 1, 1))


def dense_softmax() -> Workload:
    rng = np.random.default_rng(3)
    data = relay.var("data", shape=(4, 256))
    w1, b1 = relay.var("w1", shape=(128, 256)), relay.var("b1", shape=(128,))
    w2, b2 = relay.var("w2", shape=(10, 128)), relay.var("b2", shape=(10,))
    out = relay.nn.relu(relay.nn.bias_add(relay.nn.dense(data, w1), b1))
    out = relay.nn.softmax(relay.nn.bias_add(relay.nn.dense(out, w2), b2))
    return _module(out), _weights(rng, w1=(128, 256), b1=(128,), w2=(10, 128), b2=(10,))


def batch_matmul() -> Workload:
    rng = np.random.default_rng(4)
    q = relay.var("q", shape=(8, 64, 32))
    k = relay.var("k", shape=(8, 64, 32))
    v = relay.var("v", shape=(8, 64, 32))
    scores = relay.nn.batch_matmul(q, k) * relay.const(0.17677669, "float32")
    attn = relay.nn.softmax(scores)
    out = relay.nn.batch_matmul(attn, relay.transpose(v, (0, 2, 1)))
    w = relay.var("w", shape=(8, 32, 32))
    out = relay.nn.batch_matmul(out, w)
    return _module(out), _weights(rng, w=(8, 32, 32))


def concat_pool() -> Workload:
    rng = np.random.default_rng(5)
    data = relay.var("data", shape=(1, 16, 32, 32))
    w_a, w_b = relay.var("w_a", shape=(16, 16, 1, 1)), relay.var("w_b", shape=(16, 16, 3, 3))
    a = relay.nn.relu(relay.nn.conv2d(data, w_a, channels=16, kernel_size=(1, 1)))
    b = relay.nn.relu(relay.nn.conv2d(data, w_b, padding=(1, 1), channels=16, kernel_size=(3, 3)))
    out = relay.concatenate([a, b], axis=1)
    out = relay.nn.max_pool2d(out, pool_size=(2, 2), strides=(2, 2))
    out = relay.nn.avg_pool2d(out, pool_size=(3, 3), padding=(1, 1))
    out = relay.nn.global_avg_pool2d(out)
    return _module(out), _weights(rng, w_a=(16, 16, 1, 1), w_b=(16, 16, 3, 3))


def scalar_chain() -> Workload:
    rng = np.random.default_rng(6)
    data = relay.var("data", shape=(2, 64))
    scale = relay.var("scale", shape=(64,))
    out = data * relay.const(2.5, "float32") + relay.const(-1.25, "float32")
    out = relay.sqrt(relay.abs(out) + relay.const(1e-5, "float32"))
    out = out * (scale * relay.const(0.5, "float32") + relay.const(3.0, "float32"))
    out = relay.clip(out, -4.0, 4.0)
    out = relay.exp(out) / relay.const(7.0, "float32")
    return _module(out), _weights(rng, scale=(64,))


def repeated_blocks() -> Workload:
    """The same conv block four times and a residual: exercises dedup, weights and order."""
    rng = np.random.default_rng(7)
    data = relay.var("data", shape=(1, 8, 16, 16))
    out = data
    params: dict[str, tvm.nd.NDArray] = {}
    for i in range(4):
        w = relay.var(f"w{i}", shape=(8, 8, 3, 3))
        conv = relay.nn.relu(
            relay.nn.conv2d(out, w, padding=(1, 1), channels=8, kernel_size=(3, 3))
        )
        out = conv + out if i % 2 else conv
        params.update(_weights(rng, **{f"w{i}": (8, 8, 3, 3)}))
    return _module(out), params


def simplify_patterns() -> Workload:
    """Patterns SimplifyExpr rewrites (x * 1, x + x, reshape of reshape, cast of cast, ...)."""
    rng = np.random.default_rng(8)
    data = relay.var("data", shape=(2, 8, 4))
    w = relay.var("w", shape=(8, 8))
    out = relay.reshape(relay.reshape(data, (16, 4)), (2, 32))
    out = relay.multiply(out, relay.const(1.0, "float32"))
    out = out + out
    out = relay.reshape(out, (8, 8))
    out = relay.nn.dense(out, w)
    out = relay.cast(relay.cast(relay.cast(out, "float32"), "float16"), "float32")
    out = relay.transpose(relay.transpose(out, (1, 0)), (1, 0))
    out = (out + relay.const(1.5, "float32")) * relay.const(2.0, "float32")
    out = out * relay.const(3.0, "float32") * relay.const(0.5, "float32")
    out = relay.clip(out, -3.4028234663852886e38, 3.4028234663852886e38)
    return _module(out), _weights(rng, w=(8, 8))


SMALL_GRAPHS: dict[str, Callable[[], Workload]] = {
    "conv_bias_bn_relu": conv_bias_bn_relu,
    "depthwise_conv": depthwise_conv,
    "dense_softmax": dense_softmax,
    "batch_matmul": batch_matmul,
    "concat_pool": concat_pool,
    "scalar_chain": scalar_chain,
    "repeated_blocks": repeated_blocks,
    "simplify_patterns": simplify_patterns,
}


def partitioned_for_ccompiler() -> Workload:
    """repeated_blocks with its residual adds offloaded to the C codegen, as a BYOC user would."""
    mod, params = repeated_blocks()
    mod = relay.transform.InferType()(mod)
    offloaded = ("add",)
    try:
        for op in offloaded:
            tvm.ir.register_op_attr(op, "target.ccompiler", lambda expr: True)
        annotated = relay.transform.PartitionGraph()(
            relay.transform.MergeCompilerRegions()(
                relay.transform.AnnotateTarget(["ccompiler"])(mod)
            )
        )
    finally:
        for op in offloaded:
            relay.op.get(op).reset_attr("target.ccompiler")
    return annotated, params
