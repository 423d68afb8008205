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
from tvm.relay import loops
from tvm.relay.prelude import Prelude


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
    """Holds the live values, the params, the module's other global functions (and the Prelude,
    once a graph uses it) and the random source of one drawn graph."""

    def __init__(self, draw: Callable, seed: int) -> None:
        self.draw = draw
        self.rng = np.random.default_rng(seed)
        self.values: list[Value] = []
        self.params: dict[str, np.ndarray] = {}
        self.names = itertools.count()
        self.mod = tvm.IRModule()
        self.prelude: Prelude | None = None
        #: Inside a global function or a loop body weights are constants: a param there would be
        #: a free variable of that function, which no frontend writes.
        self.inline = False

    def weight(self, shape: tuple[int, ...], dtype: str, *, positive: bool = False) -> relay.Expr:
        """A param (bound by name later) or an inline constant: both become constants."""
        data = self.rng.uniform(0.5, 2.0, shape) if positive else self.rng.standard_normal(shape)
        return self._bound(data.astype(dtype))

    def int8_weight(self, shape: tuple[int, ...]) -> relay.Expr:
        return self._bound(self.rng.integers(-127, 128, shape).astype("int8"))

    def _bound(self, data: np.ndarray) -> relay.Expr:
        if self.inline or self.draw(st.booleans()):
            return relay.const(data)
        name = f"p{next(self.names)}"
        self.params[name] = data
        return relay.var(name, shape=data.shape, dtype=str(data.dtype))

    def scalar(self, dtype: str) -> relay.Expr:
        value = self.draw(st.sampled_from([0.5, 1.0, 2.0, -1.5, 3.25, 1e-3]))
        return relay.const(value, dtype)

    def module(self, body: relay.Expr) -> tvm.IRModule:
        """The module with ``body`` as ``main`` beside the global functions drawn so far."""
        mod = tvm.IRModule(self.mod.functions, self.mod.type_definitions)
        mod["main"] = relay.Function(relay.analysis.free_vars(body), body)
        return mod

    def infer(self, expr: relay.Expr) -> Value:
        checked = relay.transform.InferType()(self.module(expr))["main"].body
        ty = checked.checked_type
        dims = tuple(int(d) if isinstance(d, tvm.tir.IntImm) else None for d in ty.shape)
        return Value(expr, dims, ty.dtype)


Op = Callable[[_Builder, Value], Value | list[Value]]


def _smallest(dims: Iterable[int | None]) -> int:
    """The smallest static dimension; one known only at run time counts as large enough."""
    return min((d for d in dims if d is not None), default=8)


def _conv2d(b: _Builder, x: Value) -> Value:
    nhwc = x.shape[3] is not None and b.draw(st.booleans())
    channels = x.shape[3] if nhwc else x.shape[1]
    spatial = _smallest(x.shape[1:3] if nhwc else x.shape[2:])
    kernel = b.draw(st.sampled_from([1, 3] if spatial >= 3 else [1]))
    dilation = b.draw(st.sampled_from([1, 2])) if kernel > 1 and spatial >= 5 else 1
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
    return b.infer(out)


def _dense(b: _Builder, x: Value) -> Value:
    units = b.draw(st.sampled_from([4, 16, 32]))
    out = relay.nn.dense(x.expr, b.weight((units, x.shape[1]), x.dtype))
    if b.draw(st.booleans()):
        out = relay.nn.bias_add(out, b.weight((units,), x.dtype))
    return b.infer(out)


def _batch_matmul(b: _Builder, x: Value) -> Value:
    batch, _, k = x.shape
    n = b.draw(st.sampled_from([4, 8, 16]))
    return b.infer(relay.nn.batch_matmul(x.expr, b.weight((batch, n, k), x.dtype)))


def _pool(b: _Builder, x: Value) -> Value:
    kind = b.draw(st.sampled_from(["max", "avg", "global"]))
    spatial = _smallest(x.shape[2:])
    if kind == "global" or spatial < 2:
        return b.infer(relay.nn.global_avg_pool2d(x.expr))
    pool = b.draw(st.sampled_from([2, 3] if spatial >= 3 else [2]))
    stride = b.draw(st.sampled_from([1, 2]))
    make = relay.nn.max_pool2d if kind == "max" else relay.nn.avg_pool2d
    return b.infer(make(x.expr, pool_size=(pool, pool), strides=(stride, stride)))


def _unary(b: _Builder, x: Value) -> Value:
    name = b.draw(st.sampled_from(["relu", "sigmoid", "tanh", "exp", "negative", "sqrt_abs"]))
    if name == "sqrt_abs":
        return b.infer(relay.sqrt(relay.abs(x.expr)))
    if name == "relu":
        return b.infer(relay.nn.relu(x.expr))
    return b.infer(getattr(relay, name)(x.expr))


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
    return b.infer(op(*args))


def _constant_arith(b: _Builder, x: Value) -> Value:
    """A constant subexpression (weight * scalar + scalar) applied to x: folded before fusion."""
    shape = (x.shape[-1],)
    folded = b.weight(shape, x.dtype) * b.scalar(x.dtype) + b.scalar(x.dtype)
    return b.infer(x.expr * folded)


def _batch_norm(b: _Builder, x: Value) -> Value:
    c = x.shape[1]
    stats = [b.weight((c,), x.dtype) for _ in range(3)] + [b.weight((c,), x.dtype, positive=True)]
    return b.infer(relay.nn.batch_norm(x.expr, *stats)[0])


def _layer_norm(b: _Builder, x: Value) -> Value:
    c = x.shape[-1]
    return b.infer(relay.nn.layer_norm(x.expr, b.weight((c,), x.dtype), b.weight((c,), x.dtype)))


def _softmax(b: _Builder, x: Value) -> Value:
    return b.infer(relay.nn.softmax(x.expr, axis=b.draw(st.sampled_from([-1, 1]))))


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
    return b.infer(relay.concatenate([x.expr, other], axis=axis))


def _split(b: _Builder, x: Value) -> list[Value]:
    axes = [i for i, d in enumerate(x.shape) if d is not None and d % 2 == 0]
    axis = b.draw(st.sampled_from(axes))
    parts = relay.split(x.expr, 2, axis=axis)
    return [b.infer(parts[0]), b.infer(parts[1])]


def _reshape(b: _Builder, x: Value) -> Value:
    size = int(np.prod(x.shape))
    choices = [(x.shape[0], -1), (-1,)]
    if len(x.shape) == 2 and x.shape[1] % 4 == 0:
        choices.append((x.shape[0], 4, x.shape[1] // 4))
    if len(x.shape) == 3:
        choices.append((x.shape[0], x.shape[1], 1, x.shape[2]))
    if size % 4 == 0:
        choices.append((size // 4, 4))
    return b.infer(relay.reshape(x.expr, b.draw(st.sampled_from(choices))))


def _transpose(b: _Builder, x: Value) -> Value:
    axes = b.draw(st.permutations(range(len(x.shape))))
    return b.infer(relay.transpose(x.expr, list(axes)))


def _strided_slice(b: _Builder, x: Value) -> Value:
    axes = [i for i, d in enumerate(x.shape) if d is not None and d >= 2]
    axis = b.draw(st.sampled_from(axes))
    dim = int(x.shape[axis])  # type: ignore[arg-type]
    begin = b.draw(st.integers(0, dim // 2))
    stride = b.draw(st.sampled_from([1, 2]))
    return b.infer(
        relay.strided_slice(x.expr, begin=[begin], end=[dim], strides=[stride], axes=[axis])
    )


def _pad(b: _Builder, x: Value) -> Value:
    widths = [(0, 0)] * (len(x.shape) - 2) + [
        (b.draw(st.integers(0, 2)), b.draw(st.integers(0, 2))) for _ in range(2)
    ]
    return b.infer(relay.nn.pad(x.expr, widths, pad_value=b.draw(st.sampled_from([0.0, 1.0]))))


def _cast(b: _Builder, x: Value) -> Value:
    return b.infer(relay.cast(x.expr, "float16" if x.dtype == "float32" else "float32"))


def _resize(b: _Builder, x: Value) -> Value:
    size = tuple(b.draw(st.sampled_from([d // 2 or 1, d * 2, 7])) for d in x.shape[2:])
    method = b.draw(st.sampled_from(["nearest_neighbor", "linear", "cubic"]))
    return b.infer(relay.image.resize2d(x.expr, size, method=method))


def _conv1d(b: _Builder, x: Value) -> Value:
    _, channels, width = x.shape
    kernel = b.draw(st.sampled_from([1, 3] if _smallest([width]) >= 3 else [1]))
    stride = b.draw(st.sampled_from([1, 2]))
    out_channels = b.draw(st.sampled_from([4, 8]))
    out = relay.nn.conv1d(
        x.expr,
        b.weight((out_channels, channels, kernel), x.dtype),
        strides=(stride,),
        padding=(b.draw(st.sampled_from([0, kernel // 2])),),
        channels=out_channels,
        kernel_size=(kernel,),
    )
    return b.infer(out)


def _conv3d(b: _Builder, x: Value) -> Value:
    """A depth axis is made by repeating the input, convolved over, then averaged away."""
    depth = b.draw(st.sampled_from([1, 2, 3]))
    volume = relay.repeat(relay.expand_dims(x.expr, 2), depth, axis=2)
    kernel = b.draw(st.sampled_from([1, 3] if _smallest(x.shape[2:]) >= 3 else [1]))
    kd = b.draw(st.integers(1, min(depth, kernel)))
    out_channels = b.draw(st.sampled_from([4, 8]))
    out = relay.nn.conv3d(
        volume,
        b.weight((out_channels, x.shape[1], kd, kernel, kernel), x.dtype),
        strides=(1, b.draw(st.sampled_from([1, 2])), 1),
        padding=(0, kernel // 2, kernel // 2),
        channels=out_channels,
        kernel_size=(kd, kernel, kernel),
    )
    return b.infer(relay.mean(out, axis=2))


def _conv2d_transpose(b: _Builder, x: Value) -> Value:
    kernel = b.draw(st.sampled_from([2, 3, 4]))
    stride = b.draw(st.sampled_from([1, 2]))
    out_channels = b.draw(st.sampled_from([4, 8]))
    out = relay.nn.conv2d_transpose(
        x.expr,
        b.weight((x.shape[1], out_channels, kernel, kernel), x.dtype),
        strides=(stride, stride),
        padding=(b.draw(st.sampled_from([0, 1])),) * 2,
        output_padding=(b.draw(st.sampled_from([0, stride - 1])),) * 2,
        channels=out_channels,
        kernel_size=(kernel, kernel),
    )
    return b.infer(out)


def _qnn(b: _Builder, x: Value) -> Value:
    """int8 the way pre-quantized models arrive: quantize, qnn.conv2d or qnn.dense with int8
    weights (and an int32 bias), requantize, dequantize back to float32."""
    zero = relay.const(0, "int32")
    scale = relay.const(b.draw(st.sampled_from([0.05, 0.1])), "float32")
    quantized = relay.qnn.op.quantize(x.expr, scale, zero, out_dtype="int8")
    kernel_scale = relay.const(0.02, "float32")
    if len(x.shape) == 4:
        kernel = b.draw(st.sampled_from([1, 3] if min(x.shape[2:]) >= 3 else [1]))  # type: ignore[type-var]
        units = b.draw(st.sampled_from([4, 8]))
        acc = relay.qnn.op.conv2d(
            quantized,
            b.int8_weight((units, x.shape[1], kernel, kernel)),  # type: ignore[arg-type]
            zero,
            zero,
            scale,
            kernel_scale,
            kernel_size=(kernel, kernel),
            channels=units,
            padding=(kernel // 2, kernel // 2),
        )
    else:
        units = b.draw(st.sampled_from([4, 16]))
        acc = relay.qnn.op.dense(
            quantized,
            b.int8_weight((units, x.shape[1])),
            zero,
            zero,
            scale,
            kernel_scale,
            units,  # type: ignore[arg-type]
        )
    if b.draw(st.booleans()):
        bias = b._bound(b.rng.integers(-100, 100, (units,)).astype("int32"))
        acc = relay.nn.bias_add(acc, bias)
    out_scale = relay.const(0.1, "float32")
    requantized = relay.qnn.op.requantize(
        acc, relay.const(0.001, "float32"), zero, out_scale, zero, out_dtype="int8"
    )
    if b.draw(st.booleans()):
        requantized = relay.clip(requantized, 0, 127)  # a fused ReLU, as TFLite writes it
    return b.infer(relay.qnn.op.dequantize(requantized, out_scale, zero))


def _roi_align(b: _Builder, x: Value) -> Value:
    batch, _, height, width = x.shape
    count = b.draw(st.sampled_from([1, 3]))
    high = np.array([width, height], dtype="float64") - 1  # (x, y) of two corners per box
    corners = np.sort(b.rng.uniform(0, high, (count, 2, 2)), axis=1)
    index = b.rng.integers(0, batch or 1, (count, 1))
    rois = np.concatenate([index, corners.reshape(count, 4)], axis=1).astype("float32")
    out = relay.vision.roi_align(
        x.expr,
        relay.const(rois),
        pooled_size=(b.draw(st.sampled_from([1, 2, 3])),) * 2,
        spatial_scale=b.draw(st.sampled_from([1.0, 0.5])),
        sample_ratio=b.draw(st.sampled_from([-1, 2])),
        mode=b.draw(st.sampled_from(["avg", "max"])),
    )
    return b.infer(out)


def _detection(b: _Builder, x: Value) -> Value:
    """An SSD head: box offsets and class scores from dense layers, decoded against anchors by
    multibox_transform_loc, optionally followed by get_valid_counts and non_max_suppression."""
    anchors = b.draw(st.sampled_from([4, 8]))
    classes = b.draw(st.sampled_from([2, 3]))
    loc = relay.nn.dense(x.expr, b.weight((4 * anchors, x.shape[1]), x.dtype))  # type: ignore[arg-type]
    scores = relay.nn.dense(x.expr, b.weight((classes * anchors, x.shape[1]), x.dtype))  # type: ignore[arg-type]
    probs = relay.nn.softmax(relay.reshape(scores, (-1, classes, anchors)), axis=1)
    boxes = np.sort(b.rng.uniform(0, 1, (1, anchors, 2, 2)), axis=2).reshape(1, anchors, 4)
    decoded = relay.vision.multibox_transform_loc(probs, loc, relay.const(boxes.astype("float32")))
    out = decoded[0]
    if b.draw(st.booleans()):
        counts = relay.vision.get_valid_counts(out, score_threshold=0.0)
        out = relay.vision.non_max_suppression(
            counts[1],
            counts[0],
            counts[2],
            iou_threshold=b.draw(st.sampled_from([0.3, 0.5])),
            top_k=b.draw(st.sampled_from([-1, 2])),
            return_indices=False,
        )
    return b.infer(out)


def _shape_of(b: _Builder, x: Value) -> Value:
    """A value that reads only its input's shape (static even where the input is not)."""
    return b.infer(relay.cast(relay.shape_of(x.expr), x.dtype))


def _dyn_reshape(b: _Builder, x: Value) -> Value:
    """Flatten to (batch, -1) with the shape computed in the graph: a dyn.reshape, which
    folding makes static unless the input's shape is known only at run time."""
    batch = relay.strided_slice(relay.shape_of(x.expr, "int64"), begin=[0], end=[1])
    newshape = relay.concatenate([batch, relay.const([-1], "int64")], axis=0)
    return b.infer(relay.reshape(x.expr, newshape))


def _shape_arith(b: _Builder, x: Value) -> Value:
    """A shape computed from a shape: x's shape read, cast, multiplied or sliced, and fed to an
    op that takes a shape at run time (a ``dyn.broadcast_to`` of a constant, a ``dyn.reshape``,
    a ``dyn.full``); static where x is, so folding makes it static, dynamic where x is not."""
    shape = relay.shape_of(x.expr, "int64")
    kind = b.draw(st.sampled_from(["broadcast", "reshape", "full", "shape_of_shape"]))
    if kind == "broadcast":
        filled = relay.broadcast_to(b.weight((1,) * len(x.shape), x.dtype), shape)
        return b.infer(x.expr + filled)
    if kind == "reshape":
        doubled = relay.multiply(relay.take(shape, relay.const([0], "int64")),
                                 relay.const(1, "int64"))  # fmt: skip
        return b.infer(relay.reshape(x.expr, relay.concatenate(
            [doubled, relay.const([-1], "int64")], axis=0)))  # fmt: skip
    if kind == "full":
        return b.infer(x.expr * relay.full(b.scalar(x.dtype), shape, x.dtype))
    twice = relay.shape_of(relay.cast(shape, "float32"), "int32")  # static: [rank]
    return b.infer(relay.cast(twice, x.dtype))


def _shared_constant(b: _Builder, x: Value) -> Value:
    """One constant used by several ops that fuse into one function (``where(x > c, c, x * c)``
    and kin): upstream's passes keep it one object, so the fused function takes it once."""
    c = b.weight((1,) * len(x.shape) if b.draw(st.booleans()) else (), x.dtype)
    kind = b.draw(st.sampled_from(["where", "affine", "clip_like"]))
    if kind == "where":
        return b.infer(relay.where(relay.greater(x.expr, c), c, x.expr * c))
    if kind == "affine":
        return b.infer((x.expr + c) * c - c)
    return b.infer(relay.maximum(relay.minimum(x.expr, c), relay.negative(c)))


def _same_shape(b: _Builder, x: Value) -> relay.Expr:
    """An op whose result has x's type, for the two arms of an ``If``, a loop body or a
    function that must return what it takes."""
    choices: list[Op] = [_unary, _arith] + ([_softmax] if len(x.shape) > 1 else [])
    if len(x.shape) == 4 and x.shape[1] is not None:
        choices.append(_conv2d_same)
    if len(x.shape) == 2 and x.shape[1] is not None:
        choices.append(_dense_same)
    result = b.draw(st.sampled_from(choices))(b, x)
    assert isinstance(result, Value)
    return result.expr


def _conv2d_same(b: _Builder, x: Value) -> Value:
    channels = x.shape[1]
    w = b.weight((channels, channels, 3, 3), x.dtype)  # type: ignore[arg-type]
    return b.infer(
        relay.nn.conv2d(x.expr, w, padding=(1, 1), channels=channels, kernel_size=(3, 3))
    )


def _dense_same(b: _Builder, x: Value) -> Value:
    return b.infer(relay.nn.dense(x.expr, b.weight((x.shape[1],) * 2, x.dtype)))  # type: ignore[arg-type]


def _if(b: _Builder, x: Value) -> Value:
    """An ``If`` on a bool input or on the data (the sum of x is positive)."""
    if b.draw(st.booleans()):
        cond: relay.Expr = relay.var(f"flag{next(b.names)}", shape=(), dtype="bool")
    else:
        cond = relay.greater(relay.sum(x.expr), relay.const(0.0, x.dtype))
    return b.infer(relay.If(cond, _same_shape(b, x), _same_shape(b, x)))


def _local(b: _Builder, x: Value, name: str) -> Value:
    """A fresh variable of x's type, for the parameter of a function the graph defines."""
    shape = [relay.Any() if d is None else d for d in x.shape]
    return Value(relay.var(f"{name}{next(b.names)}", shape=shape, dtype=x.dtype), x.shape, x.dtype)


def _while_loop(b: _Builder, x: Value) -> Value:
    """A let-bound recursive function running a shape-preserving op 1 to 3 times."""
    rounds = b.draw(st.integers(1, 3))
    i = relay.var(f"i{next(b.names)}", shape=(), dtype="int32")
    h = _local(b, x, "h")
    b.inline, was = True, b.inline
    step = _same_shape(b, h)
    b.inline = was
    loop = loops.while_loop(
        lambda i, h_: relay.less(i, relay.const(rounds, "int32")),
        [i, h.expr],
        lambda i, h_: [i + relay.const(1, "int32"), relay.bind(step, {h.expr: h_})],
    )
    return b.infer(relay.TupleGetItem(loop(relay.const(0, "int32"), x.expr), 1))


def _global_call(b: _Builder, x: Value) -> Value:
    """x passed through a global function of the module (with its return type annotated, as
    frontends write them)."""
    arg = _local(b, x, "a")
    b.inline, was = True, b.inline
    body = _same_shape(b, arg)
    b.inline = was
    ret = relay.TensorType([relay.Any() if d is None else d for d in x.shape], x.dtype)
    gvar = relay.GlobalVar(f"f{next(b.names)}")
    b.mod[gvar] = relay.Function([arg.expr], body, ret_type=ret)
    others = [g for g in b.mod.get_global_vars() if g.name_hint.startswith("f") and g != gvar]
    callee = b.mod[others[-1]] if others else None
    if (
        callee is not None
        and b.draw(st.booleans())
        and len(callee.params) == 1
        and tvm.ir.structural_equal(callee.params[0].type_annotation, ret)
        and tvm.ir.structural_equal(callee.ret_type, ret)
    ):
        # A global function that calls an earlier one of the same type (several, nested).
        outer, inner = _local(b, x, "a"), relay.GlobalVar(f"f{next(b.names)}")
        b.mod[inner] = relay.Function([outer.expr], relay.Call(gvar, [relay.Call(others[-1], [
            outer.expr])]), ret_type=ret)  # fmt: skip
        gvar = inner
    return b.infer(relay.Call(gvar, [x.expr]))


def _prelude_list(b: _Builder, x: Value) -> Value:
    """x and a shape-preserving op of it in a Prelude ``List``, read back by a Prelude
    function (the module then carries the whole Prelude, as the PyTorch frontend's does).

    Not ``rev``: upstream's VM compiler fails on it whatever the list holds.
    """
    if b.prelude is None:
        b.prelude = Prelude(b.mod)
    _, cons, nil = b.mod.get_type("List")
    items = cons(x.expr, cons(_same_shape(b, x), nil()))
    how = b.draw(st.sampled_from(["hd", "nth", "foldl"]))
    if how == "hd":
        return b.infer(b.prelude.hd(items))
    if how == "nth":
        return b.infer(b.prelude.nth(items, relay.const(b.draw(st.integers(0, 1)), "int32")))
    acc, item = _local(b, x, "acc"), _local(b, x, "item")
    return b.infer(
        b.prelude.foldl(relay.Function([acc.expr, item.expr], acc.expr + item.expr), x.expr, items)
    )


#: Which ops take which ranks. Convolutions, pooling, batch_norm, resize, roi_align want rank 4
#: (NCHW, except the NHWC conv2d variant); dense and the detection head rank 2; batch_matmul and
#: conv1d rank 3. The last four wrap a shape-preserving op in control flow, a global function or
#: a Prelude list.
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
    "conv1d": (_conv1d, (3,)),
    "conv3d": (_conv3d, (4,)),
    "conv2d_transpose": (_conv2d_transpose, (4,)),
    "qnn": (_qnn, (2, 4)),
    "roi_align": (_roi_align, (4,)),
    "detection": (_detection, (2,)),
    "shape_of": (_shape_of, (1, 2, 3, 4)),
    "dyn_reshape": (_dyn_reshape, (2, 3, 4)),
    "if": (_if, (1, 2, 3, 4)),
    "while_loop": (_while_loop, (1, 2, 3, 4)),
    "global_call": (_global_call, (1, 2, 3, 4)),
    "shape_arith": (_shape_arith, (1, 2, 3, 4)),
    "shared_constant": (_shared_constant, (1, 2, 3, 4)),
    "prelude_list": (_prelude_list, (1, 2, 3, 4)),
}

#: Ops that take float32 only (quantization, and vision ops TOPI implements for float32).
_FLOAT32_ONLY = {"qnn", "roi_align", "detection"}
#: Ops whose work grows with the input's size: kept to small inputs.
_SIZED = {"conv2d", "pool2d", "resize2d", "conv3d", "conv2d_transpose", "qnn", "roi_align"}

_INPUT_SHAPES = st.one_of(
    st.tuples(st.sampled_from([1, 2]), st.sampled_from([4, 8]), *[st.sampled_from([6, 8, 12])] * 2),
    st.tuples(st.sampled_from([1, 4]), st.sampled_from([16, 32])),
    st.tuples(st.sampled_from([2, 4]), st.sampled_from([4, 8]), st.sampled_from([8, 16])),
)


#: The dimensions an op reads to build its weights or attributes: they must be static.
_READS: dict[str, Callable[[Value], Iterable[int]]] = {
    "conv2d": lambda x: [1],
    "conv1d": lambda x: [1],
    "conv3d": lambda x: [1],
    "conv2d_transpose": lambda x: [1],
    "qnn": lambda x: range(1, len(x.shape)),
    "roi_align": lambda x: range(1, len(x.shape)),
    "detection": lambda x: [1],
    "pool2d": lambda x: [1],
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
    if name in _FLOAT32_ONLY and x.dtype != "float32":
        return False
    if name in _SIZED:
        return int(np.prod([d for d in x.shape if d is not None])) <= 1 << 15
    return True


@st.composite
def relay_graphs(draw: Callable, max_ops: int = 8) -> Graph:
    """A random Relay module of 1..max_ops ops on one float32 input, with its params.

    One graph in four has a dynamic batch (``relay.Any()``), one rank-4 input in four dynamic
    height and width, one rank-3 input in four a dynamic sequence (axis 1): ops that read a
    dimension to build weights or attributes are then drawn only where that dimension is static.
    Up to three outputs, sometimes as a nested tuple.
    """
    b = _Builder(draw, draw(st.integers(0, 2**32 - 1)))
    shape: tuple[int | None, ...] = draw(_INPUT_SHAPES)
    if draw(st.sampled_from([False, False, False, True])):
        shape = (None, *shape[1:])
    if len(shape) == 4 and draw(st.sampled_from([False, False, False, True])):
        shape = (*shape[:2], None, None)
    if len(shape) == 3 and draw(st.sampled_from([False, False, False, True])):
        shape = (shape[0], None, shape[2])
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
    extra = draw(st.integers(0, min(2, len(b.values) - 2)))
    outputs += (
        [
            v.expr
            for v in draw(st.lists(st.sampled_from(b.values[1:-1]), min_size=extra, max_size=extra))
        ]
        if extra
        else []
    )
    if len(outputs) == 3 and draw(st.booleans()):
        outputs = [outputs[0], relay.Tuple(outputs[1:])]
    body = outputs[0] if len(outputs) == 1 else relay.Tuple(outputs)
    used = {v.name_hint for v in relay.analysis.free_vars(body)}
    params = {name: data for name, data in b.params.items() if name in used}  # unused go too
    return Graph(b.module(body), params, ops)


def linked_repeats() -> tvm.IRModule:
    """Three conv blocks with linked params, the last two with the very same weights."""
    rng = np.random.default_rng(0)
    weights = [relay.const(rng.standard_normal((8, 8, 3, 3)).astype("float32")) for _ in "ab"]
    data = relay.var("data", shape=(1, 8, 8, 8))
    out = data
    for weight in (weights[1], weights[0], weights[0]):
        conv = relay.nn.conv2d(out, weight, padding=(1, 1), channels=8, kernel_size=(3, 3))
        out = relay.nn.relu(conv)
    mod = tvm.IRModule.from_expr(relay.Function([data], out))
    return mod.with_attr("executor", relay.backend.Executor("graph", {"link-params": True}))
