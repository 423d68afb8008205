"""A hypothesis strategy for random, well-typed Relay graphs built from ops real networks use.

A graph grows one op at a time from a single input: every step picks a live value, an op that
accepts its rank and dtype, and that op's attributes (shapes, strides, dilation, groups, axes,
...). Weights are params or inline constants with seeded random values, so both the binding and
the constant-folding paths of the pipeline are exercised. The drawn ``Graph`` prints as the
Relay text of its module, which is what hypothesis shows for a failing example.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import tvm
from hypothesis import strategies as st
from tvm import relay


@dataclass(frozen=True)
class Value:
    """A live value; ``None`` in its shape is a dimension known only at run time (relay.Any)."""

    expr: relay.Expr
    shape: tuple[int | None, ...]
    dtype: str


@dataclass
class Graph:
    """What a strategy run builds: the module, its params, and the ops it used (for reports)."""

    mod: tvm.IRModule
    params: dict[str, np.ndarray]
    ops: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        shapes = {name: value.shape for name, value in self.params.items()}
        return f"Graph(ops={self.ops}, params={shapes})\n{self.mod}"


class _Builder:
    """Holds the live values, the params and the random source of one drawn graph."""

    def __init__(self, draw: Callable, seed: int) -> None:
        self.draw = draw
        self.rng = np.random.default_rng(seed)
        self.values: list[Value] = []
        self.params: dict[str, np.ndarray] = {}
        self.names = itertools.count()

    def weight(self, shape: tuple[int, ...], dtype: str, *, positive: bool = False) -> relay.Expr:
        """A param (bound by name later) or an inline constant: both become constants."""
        data = self.rng.uniform(0.5, 2.0, shape) if positive else self.rng.standard_normal(shape)
        data = data.astype(dtype)
        if self.draw(st.booleans()):
            return relay.const(data)
        name = f"p{next(self.names)}"
        self.params[name] = data
        return relay.var(name, shape=shape, dtype=dtype)

    def scalar(self, dtype: str) -> relay.Expr:
        value = self.draw(st.sampled_from([0.5, 1.0, 2.0, -1.5, 3.25, 1e-3]))
        return relay.const(value, dtype)


Op = Callable[[_Builder, Value], Value | list[Value]]


def _infer(expr: relay.Expr) -> Value:
    checked = relay.transform.InferType()(tvm.IRModule.from_expr(expr))["main"].body
    ty = checked.checked_type
    dims = tuple(int(d) if isinstance(d, tvm.tir.IntImm) else None for d in ty.shape)
    return Value(expr, dims, ty.dtype)


def _conv2d(b: _Builder, x: Value) -> Value:
    nhwc = b.draw(st.booleans())
    channels = x.shape[3] if nhwc else x.shape[1]
    spatial = x.shape[1:3] if nhwc else x.shape[2:]
    kernel = b.draw(st.sampled_from([1, 3] if min(spatial) >= 3 else [1]))
    dilation = b.draw(st.sampled_from([1, 2])) if kernel > 1 and min(spatial) >= 5 else 1
    stride = b.draw(st.sampled_from([1, 2]))
    padding = b.draw(st.sampled_from([0, kernel // 2 * dilation]))
    depthwise = b.draw(st.booleans())
    groups = channels if depthwise else 1
    out_channels = channels if depthwise else b.draw(st.sampled_from([4, 8, 16]))
    if nhwc:
        w_shape = (kernel, kernel, channels // groups, out_channels)
        layouts = {"data_layout": "NHWC", "kernel_layout": "HWOI" if depthwise else "HWIO"}
        if depthwise:
            w_shape = (kernel, kernel, out_channels, 1)
    else:
        w_shape = (out_channels, channels // groups, kernel, kernel)
        layouts = {}
    out = relay.nn.conv2d(
        x.expr,
        b.weight(w_shape, x.dtype),
        strides=(stride, stride),
        padding=(padding, padding),
        dilation=(dilation, dilation),
        groups=groups,
        channels=out_channels,
        kernel_size=(kernel, kernel),
        **layouts,
    )
    return _infer(out)


def _dense(b: _Builder, x: Value) -> Value:
    units = b.draw(st.sampled_from([4, 16, 32]))
    out = relay.nn.dense(x.expr, b.weight((units, x.shape[1]), x.dtype))
    if b.draw(st.booleans()):
        out = relay.nn.bias_add(out, b.weight((units,), x.dtype))
    return _infer(out)


def _batch_matmul(b: _Builder, x: Value) -> Value:
    batch, _, k = x.shape
    n = b.draw(st.sampled_from([4, 8, 16]))
    return _infer(relay.nn.batch_matmul(x.expr, b.weight((batch, n, k), x.dtype)))


def _pool(b: _Builder, x: Value) -> Value:
    kind = b.draw(st.sampled_from(["max", "avg", "global"]))
    if kind == "global" or min(x.shape[2:]) < 2:
        return _infer(relay.nn.global_avg_pool2d(x.expr))
    pool = b.draw(st.sampled_from([2, 3] if min(x.shape[2:]) >= 3 else [2]))
    stride = b.draw(st.sampled_from([1, 2]))
    make = relay.nn.max_pool2d if kind == "max" else relay.nn.avg_pool2d
    return _infer(make(x.expr, pool_size=(pool, pool), strides=(stride, stride)))


def _unary(b: _Builder, x: Value) -> Value:
    name = b.draw(st.sampled_from(["relu", "sigmoid", "tanh", "exp", "negative", "sqrt_abs"]))
    if name == "sqrt_abs":
        return _infer(relay.sqrt(relay.abs(x.expr)))
    if name == "relu":
        return _infer(relay.nn.relu(x.expr))
    return _infer(getattr(relay, name)(x.expr))


def _arith(b: _Builder, x: Value) -> Value:
    op = b.draw(st.sampled_from([relay.add, relay.subtract, relay.multiply, relay.divide]))
    kinds = ["scalar", "self"]
    if len(x.shape) > 1 and x.shape[1] is not None:
        kinds.append("channel")
    if None not in x.shape:
        kinds.append("full")
    kind = b.draw(st.sampled_from(kinds))
    if kind == "scalar":
        other = b.scalar(x.dtype)
    elif kind == "self":
        other = x.expr
    else:
        channel = len(x.shape) > 1 and kind == "channel"
        shape = (x.shape[1],) + (1,) * (len(x.shape) - 2) if channel else x.shape
        other = b.weight(shape, x.dtype, positive=op is relay.divide)
    args = (other, x.expr) if b.draw(st.booleans()) and op is not relay.divide else (x.expr, other)
    return _infer(op(*args))


def _constant_arith(b: _Builder, x: Value) -> Value:
    """A constant subexpression (weight * scalar + scalar) applied to x: folded before fusion."""
    shape = (x.shape[-1],)
    folded = b.weight(shape, x.dtype) * b.scalar(x.dtype) + b.scalar(x.dtype)
    return _infer(x.expr * folded)


def _batch_norm(b: _Builder, x: Value) -> Value:
    c = x.shape[1]
    stats = [b.weight((c,), x.dtype) for _ in range(3)] + [b.weight((c,), x.dtype, positive=True)]
    return _infer(relay.nn.batch_norm(x.expr, *stats)[0])


def _layer_norm(b: _Builder, x: Value) -> Value:
    c = x.shape[-1]
    return _infer(relay.nn.layer_norm(x.expr, b.weight((c,), x.dtype), b.weight((c,), x.dtype)))


def _softmax(b: _Builder, x: Value) -> Value:
    return _infer(relay.nn.softmax(x.expr, axis=b.draw(st.sampled_from([-1, 1]))))


def _concatenate(b: _Builder, x: Value) -> Value:
    axis = b.draw(st.integers(0, len(x.shape) - 1))
    twin = [v for v in b.values if v is not x and len(v.shape) == len(x.shape)]
    twin = [
        v
        for v in twin
        if v.dtype == x.dtype
        and all(v.shape[i] == x.shape[i] for i in range(len(x.shape)) if i != axis)
    ]
    other = b.draw(st.sampled_from(twin)).expr if twin else b.weight(x.shape, x.dtype)
    return _infer(relay.concatenate([x.expr, other], axis=axis))


def _split(b: _Builder, x: Value) -> list[Value]:
    axes = [i for i, d in enumerate(x.shape) if d is not None and d % 2 == 0]
    axis = b.draw(st.sampled_from(axes))
    parts = relay.split(x.expr, 2, axis=axis)
    return [_infer(parts[0]), _infer(parts[1])]


def _reshape(b: _Builder, x: Value) -> Value:
    size = int(np.prod(x.shape))
    choices = [(x.shape[0], -1), (-1,)]
    if len(x.shape) == 2 and x.shape[1] % 4 == 0:
        choices.append((x.shape[0], 4, x.shape[1] // 4))
    if len(x.shape) == 3:
        choices.append((x.shape[0], x.shape[1], 1, x.shape[2]))
    if size % 4 == 0:
        choices.append((size // 4, 4))
    return _infer(relay.reshape(x.expr, b.draw(st.sampled_from(choices))))


def _transpose(b: _Builder, x: Value) -> Value:
    axes = b.draw(st.permutations(range(len(x.shape))))
    return _infer(relay.transpose(x.expr, list(axes)))


def _strided_slice(b: _Builder, x: Value) -> Value:
    axes = [i for i, d in enumerate(x.shape) if d is not None and d >= 2]
    axis = b.draw(st.sampled_from(axes))
    dim = int(x.shape[axis])  # type: ignore[arg-type]
    begin = b.draw(st.integers(0, dim // 2))
    stride = b.draw(st.sampled_from([1, 2]))
    return _infer(
        relay.strided_slice(x.expr, begin=[begin], end=[dim], strides=[stride], axes=[axis])
    )


def _pad(b: _Builder, x: Value) -> Value:
    widths = [(0, 0)] * (len(x.shape) - 2) + [
        (b.draw(st.integers(0, 2)), b.draw(st.integers(0, 2))) for _ in range(2)
    ]
    return _infer(relay.nn.pad(x.expr, widths, pad_value=b.draw(st.sampled_from([0.0, 1.0]))))


def _cast(b: _Builder, x: Value) -> Value:
    return _infer(relay.cast(x.expr, "float16" if x.dtype == "float32" else "float32"))


def _resize(b: _Builder, x: Value) -> Value:
    size = tuple(b.draw(st.sampled_from([d // 2 or 1, d * 2, 7])) for d in x.shape[2:])
    method = b.draw(st.sampled_from(["nearest_neighbor", "linear", "cubic"]))
    return _infer(relay.image.resize2d(x.expr, size, method=method))


#: Which ops take which ranks. Convolutions, pooling, batch_norm, resize want rank 4 (NCHW,
#: except the NHWC conv2d variant); dense rank 2; batch_matmul rank 3.
OPS: dict[str, tuple[Op, tuple[int, ...]]] = {
    "conv2d": (_conv2d, (4,)),
    "dense": (_dense, (2,)),
    "batch_matmul": (_batch_matmul, (3,)),
    "pool2d": (_pool, (4,)),
    "unary": (_unary, (1, 2, 3, 4)),
    "arith": (_arith, (1, 2, 3, 4)),
    "constant_arith": (_constant_arith, (1, 2, 3, 4)),
    "batch_norm": (_batch_norm, (2, 4)),
    "layer_norm": (_layer_norm, (2, 3, 4)),
    "softmax": (_softmax, (2, 3, 4)),
    "concatenate": (_concatenate, (1, 2, 3, 4)),
    "split": (_split, (1, 2, 3, 4)),
    "reshape": (_reshape, (2, 3, 4)),
    "transpose": (_transpose, (2, 3, 4)),
    "strided_slice": (_strided_slice, (1, 2, 3, 4)),
    "pad": (_pad, (2, 3, 4)),
    "cast": (_cast, (1, 2, 3, 4)),
    "resize2d": (_resize, (4,)),
}

_INPUT_SHAPES = st.one_of(
    st.tuples(st.sampled_from([1, 2]), st.sampled_from([4, 8]), *[st.sampled_from([6, 8, 12])] * 2),
    st.tuples(st.sampled_from([1, 4]), st.sampled_from([16, 32])),
    st.tuples(st.sampled_from([2, 4]), st.sampled_from([4, 8]), st.sampled_from([8, 16])),
)


#: The dimensions an op reads to build its weights or attributes: they must be static.
_READS: dict[str, Callable[[Value], Iterable[int]]] = {
    "conv2d": lambda x: range(1, len(x.shape)),
    "pool2d": lambda x: range(1, len(x.shape)),
    "resize2d": lambda x: range(1, len(x.shape)),
    "dense": lambda x: [1],
    "batch_norm": lambda x: [1],
    "constant_arith": lambda x: [-1],
    "layer_norm": lambda x: [-1],
    "batch_matmul": lambda x: range(len(x.shape)),
    "concatenate": lambda x: range(len(x.shape)),
    "reshape": lambda x: range(len(x.shape)),
}


def _applicable(name: str, x: Value) -> bool:
    _, ranks = OPS[name]
    if len(x.shape) not in ranks or x.shape[0] == 0:
        return False
    if name in _READS and any(x.shape[i] is None for i in _READS[name](x)):
        return False
    if name == "split":
        return any(d is not None and d % 2 == 0 for d in x.shape)
    if name == "strided_slice":
        return any(d is not None and d >= 2 for d in x.shape)
    if name in ("conv2d", "pool2d", "resize2d"):
        return int(np.prod([d for d in x.shape if d is not None])) <= 1 << 15
    return True


@st.composite
def relay_graphs(draw: Callable, max_ops: int = 8) -> Graph:
    """A random Relay module of 1..max_ops ops on one float32 input, with its params.

    One graph in four has a dynamic batch (``relay.Any()``): ops that read a dimension to build
    weights or attributes are then drawn only where that dimension is static.
    """
    b = _Builder(draw, draw(st.integers(0, 2**32 - 1)))
    shape: tuple[int | None, ...] = draw(_INPUT_SHAPES)
    if draw(st.sampled_from([False, False, False, True])):
        shape = (None, *shape[1:])
    relay_shape = [relay.Any() if d is None else d for d in shape]
    data = relay.var("data", shape=relay_shape, dtype="float32")
    b.values.append(Value(data, shape, "float32"))
    ops: list[str] = []
    for _ in range(draw(st.integers(1, max_ops))):
        # Mostly grow the newest value (a chain); sometimes branch off an older one.
        x = b.values[-1] if draw(st.booleans()) else draw(st.sampled_from(b.values))
        name = draw(st.sampled_from([n for n in OPS if _applicable(n, x)]))
        result = OPS[name][0](b, x)
        b.values.extend(result if isinstance(result, list) else [result])
        ops.append(name)
    outputs = [b.values[-1].expr]
    if len(b.values) > 2 and draw(st.booleans()):
        outputs.append(draw(st.sampled_from(b.values[1:-1])).expr)
    body = outputs[0] if len(outputs) == 1 else relay.Tuple(outputs)
    free = relay.analysis.free_vars(body)
    used = {v.name_hint for v in free}  # branches left unused take their weights with them
    params = {name: data for name, data in b.params.items() if name in used}
    return Graph(tvm.IRModule.from_expr(relay.Function(free, body)), params, ops)
