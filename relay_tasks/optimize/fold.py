"""Constant folding in numpy, bit-identical to TVM's ``FoldConstant`` for the ops it covers.

Upstream's ``FoldConstant`` evaluates every call whose arguments are all constants by compiling it
with LLVM and running it (a fresh build and MCJIT load per call: about 80% of upstream's
extraction time). The weights-side arithmetic that reaches it (batch-norm folding, layout changes
of weights, position-id arithmetic) is exact in numpy, so this module evaluates those calls
directly and leaves the rest, and every structural subtlety of the pass (let-inlining, tuples,
``if``, ``shape_of``), to TVM's own ``FoldConstant``; when nothing of that kind is left, TVM's
pass is skipped and the module only typed, which is all it would have done.

A call is folded here only when its op has an evaluator below, its inputs are free of NaN (whose
payload is not portable through arithmetic; ops that only move elements keep it), and the result
has exactly the shape and dtype Relay inferred for the call; anything else falls through to TVM.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np
import numpy.typing as npt
import tvm
from tvm import relay
from tvm.runtime import Object

from ..errors import ExtractionError
from ..ir import (
    is_primitive_task,
    node_key,
    op_name,
    patched,
    reads_of,
    rebuild,
    with_children,
    with_functions,
)

Array = npt.NDArray[Any]
Evaluator = Callable[[Any, Sequence[Array]], Array | None]

#: Dtypes whose arithmetic is done here; others (float16, integers but see below) go to TVM.
_ARITH_DTYPES = frozenset({"float32", "float64"})


def _arith(fn: Callable[..., Array]) -> Evaluator:
    """An elementwise op of same-dtype operands (Relay's type rule), computed into the aligned
    buffer that becomes the folded constant."""
    return functools.partial(_elementwise, fn)


def _elementwise(fn: Callable[..., Array], attrs: Any, args: Sequence[Array]) -> Array | None:
    dtype = args[0].dtype
    if str(dtype) not in _ARITH_DTYPES or any(a.dtype != dtype for a in args):
        return None
    out = aligned_empty(np.broadcast_shapes(*(a.shape for a in args)), dtype)
    with np.errstate(all="ignore"):
        fn(*args, out=out)
    return out


#: Integer dtypes whose add and subtract are done here (position ids and shape arithmetic in
#: frontend graphs), when nothing overflows: TVM's LLVM code adds with no signed wrap, so an
#: overflow has no defined value to match.
_INT_DTYPES = frozenset({"int32", "int64"})


def _sum(fn: Callable[..., Array]) -> Evaluator:
    return functools.partial(_exact_sum, fn)


def _exact_sum(fn: Callable[..., Array], attrs: Any, args: Sequence[Array]) -> Array | None:
    """``add`` or ``subtract``: floats as any arithmetic op, integers when no element wraps."""
    a, b = args
    if str(a.dtype) not in _INT_DTYPES or b.dtype != a.dtype:
        return _elementwise(fn, attrs, args)
    out = aligned_empty(np.broadcast_shapes(a.shape, b.shape), a.dtype)
    fn(a, b, out=out)  # numpy wraps; the sign test below finds every wrapped element
    # Wrapped: a sum whose sign differs from both operands'; a difference of operands of
    # different signs whose sign differs from the first's.
    wrapped = (a ^ out) & (b ^ out) if fn is np.add else (a ^ b) & (a ^ out)
    return None if out.size and wrapped.min() < 0 else out


def _negative(x: Array, *, out: Array) -> Array:
    # TOPI's negative is 0 - x, so -(0.0) stays +0.0 where numpy's unary minus gives -0.0.
    return np.subtract(np.asarray(0, dtype=x.dtype), x, out=out)


def _rsqrt(x: Array, *, out: Array) -> Array:
    # TVM lowers rsqrt to 1 / sqrt(x) for llvm: two correctly rounded steps, as here.
    return np.divide(np.asarray(1, dtype=x.dtype), np.sqrt(x), out=out)


def _expand_dims(attrs: Any, args: Sequence[Array]) -> Array:
    (x,) = args
    axis = int(attrs.axis)
    if axis < 0:
        axis += x.ndim + 1
    return x.reshape(x.shape[:axis] + (1,) * int(attrs.num_newaxis) + x.shape[axis:])


def _squeeze(attrs: Any, args: Sequence[Array]) -> Array:
    (x,) = args
    if attrs.axis is None:
        return x.reshape([d for d in x.shape if d != 1])
    axes = {int(a) % x.ndim for a in attrs.axis}
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


def _transpose(attrs: Any, args: Sequence[Array]) -> Array:
    (x,) = args
    axes = None if attrs.axes is None else [int(a) for a in attrs.axes]
    return contiguous(np.transpose(x, axes))


#: NDArray's alignment: a buffer aligned to it becomes a Relay constant without a copy.
_ALIGNMENT = 64
#: Tile edge for copying a transposed matrix: both tiles stay in the L1/L2 cache.
_TILE = 64
#: Arrays from this size on get populated mappings of their own.
_POPULATE_MIN_BYTES = 1 << 20
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only; elsewhere pages fault in as usual


def aligned_empty(shape: Sequence[int], dtype: Any) -> Array:
    """An uninitialised C-contiguous array that :func:`as_ndarray` can wrap without copying.

    Large ones are mapped with their pages populated up front: touching fresh memory page by
    page costs more than computing a folded weight (13 ms per 7 MB here, 5 ms populated).
    """
    kind = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * kind.itemsize
    if nbytes >= _POPULATE_MIN_BYTES:
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
        mapped: Array = np.frombuffer(pages, dtype=kind).reshape(tuple(shape))
        return mapped  # page-aligned, writable, and it keeps the mapping alive
    raw = np.empty(nbytes + _ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    aligned: Array = raw[start : start + nbytes].view(kind).reshape(tuple(shape))
    return aligned


def contiguous(x: Array) -> Array:
    """``x`` as a fresh aligned C-contiguous array.

    A transposed weight matrix copied element by element misses the cache on every write
    (numpy's own copy does that: 18 ms for a 3072x768 float32 matrix here); copied in square
    tiles it takes 2.5 ms, and BERT-base has 72 of them.
    """
    out = aligned_empty(x.shape, x.dtype)
    rows = None if x.flags.c_contiguous else _as_transposed_matrix(x)
    if rows is None or rows.size < _TILE * _TILE:
        np.copyto(out, x)
        return out
    target = out.reshape(rows.shape)
    for i in range(0, rows.shape[0], _TILE):
        for j in range(0, rows.shape[1], _TILE):
            target[i : i + _TILE, j : j + _TILE] = rows[i : i + _TILE, j : j + _TILE]
    return out


def _as_transposed_matrix(x: Array) -> Array | None:
    """``x`` as a 2-D matrix (its leading axes as rows) that is the transpose of a C-contiguous
    one, when it is: a weight transposed as two blocks of axes; else None."""
    for split in range(1, x.ndim):
        base = np.transpose(x, [*range(split, x.ndim), *range(split)])
        if base.flags.c_contiguous:
            return base.reshape(-1, int(np.prod(x.shape[:split]))).T
    return None


def as_ndarray(value: Array) -> tvm.nd.NDArray:
    """``value`` as a TVM NDArray, sharing its buffer when it is fresh, aligned and writable
    (copying a large folded weight into a new NDArray costs as much as computing it)."""
    if value.dtype == np.bool_ or value.size == 0:
        return tvm.nd.array(value)  # DLPack has no bool here; nothing to share in an empty one
    fresh = value.flags.c_contiguous and value.flags.writeable
    if not (fresh and value.ctypes.data % _ALIGNMENT == 0):
        value = contiguous(value)
    try:
        return tvm.nd.from_dlpack(value)
    except (BufferError, TypeError, tvm.TVMError):
        return tvm.nd.array(value)


def _reshape_like_type(attrs: Any, args: Sequence[Array]) -> Array | None:
    # The target shape comes from the call's inferred type (checked by the caller), which
    # sidesteps Relay's special reshape codes (0, -1, -2, -3, -4).
    return args[0]


def _concatenate(attrs: Any, args: Sequence[Array]) -> Array:
    return np.concatenate(list(args), axis=int(attrs.axis))


def _pad(attrs: Any, args: Sequence[Array]) -> Array | None:
    x, pad_value = args
    if str(attrs.pad_mode) != "constant":
        return None
    widths = [(int(lo), int(hi)) for lo, hi in attrs.pad_width]
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        return None
    return np.pad(x, widths, mode="constant", constant_values=pad_value.astype(x.dtype).item())


def _cast(attrs: Any, args: Sequence[Array]) -> Array | None:
    (x,) = args
    return _exact_cast(x, str(attrs.dtype))


def _exact_cast(x: Array, dtype: str) -> Array | None:
    """``x`` converted as TVM converts it, where numpy provably does the same; else None.

    Float-to-float conversions round to nearest even in both numpy and LLVM; integers wrap to
    narrower integers (LLVM's trunc) and round to nearest into float32/float64 (sitofp/uitofp).
    Float-to-integer overflow is target-specific, an integer reaches float16 through a double
    rounding in numpy, and TVM's float64 -> float16 is not numpy's (it turns 1.0 into 0 on this
    build), so TVM does those.
    """
    src = str(x.dtype)
    if (src, dtype) in _EXACT_CASTS:
        return x.astype(dtype)
    if src in _INTEGERS and (dtype in _INTEGERS or dtype in ("float32", "float64")):
        return x.astype(dtype)
    return None


_INTEGERS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})


_EXACT_CASTS = frozenset(
    {
        ("float16", "float16"),
        ("float16", "float32"),
        ("float16", "float64"),
        ("float32", "float16"),
        ("float32", "float32"),
        ("float32", "float64"),
        ("float64", "float32"),
        ("float64", "float64"),
    }
)


def _layout_transform(attrs: Any, args: Sequence[Array]) -> Array | None:
    return layout_transform(args[0], str(attrs.src_layout), str(attrs.dst_layout))


def _winograd_weight_transform(attrs: Any, args: Sequence[Array]) -> Array | None:
    """TOPI's ``conv2d_winograd_weight_transform``: G . kernel . G^T, summed as TVM runs it.

    The generic CPU schedule keeps the reduction order of the TE compute (kh outer, kw inner,
    starting from 0) and LLVM may not reassociate without fast-math, so adding the float32
    products in that same order here gives the same bits (checked against TVM in the tests).
    """
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    (kernel,) = args
    if kernel.dtype != np.float32 or kernel.ndim != 4 or kernel.shape[2] != kernel.shape[3]:
        return None
    tile, size = int(attrs.tile_size), kernel.shape[3]
    if not (1 < tile < 9 and 2 < size < 8):
        return None
    _, _, g_data = _cook_toom_convolution(_interpolation_points(tile + size - 2), tile, size)
    g = g_data.astype(np.float32)
    alpha = tile + size - 1
    acc = np.zeros((alpha, alpha, *kernel.shape[:2]), dtype=np.float32)
    for kh in range(size):
        for kw in range(size):
            scaled = kernel[None, :, :, kh, kw] * g[:, kh, None, None]
            acc = acc + scaled[:, None] * g[None, :, kw, None, None]
    return acc


def _batch_flatten(attrs: Any, args: Sequence[Array]) -> Array:
    (x,) = args
    return x.reshape(x.shape[0], -1)


def _broadcast_to(attrs: Any, args: Sequence[Array]) -> Array:
    (x,) = args
    return np.broadcast_to(x, tuple(int(d) for d in attrs.shape))


def _full(attrs: Any, args: Sequence[Array]) -> Array | None:
    (fill,) = args
    dtype = str(attrs.dtype) or str(fill.dtype)  # no dtype: the fill value's
    value = _exact_cast(fill, dtype) if fill.ndim == 0 else None
    if value is None:
        return None
    return np.full(tuple(int(d) for d in attrs.shape), value, dtype=value.dtype)


def _take(attrs: Any, args: Sequence[Array]) -> Array | None:
    """``take`` in its default ``clip`` mode: out-of-range indices (negative ones too) clamp to
    the axis, as numpy's clip mode does."""
    data, indices = args
    if str(attrs.mode) != "clip" or int(attrs.batch_dims) != 0 or indices.dtype.kind not in "iu":
        return None
    axis = None if attrs.axis is None else int(attrs.axis)
    return np.take(data, indices, axis=axis, mode="clip")


def _where(attrs: Any, args: Sequence[Array]) -> Array:
    condition, x, y = args
    return np.where(condition != 0, x, y)


#: Operand kinds compared here: exact in any representation (NaN inputs never get this far).
_COMPARABLE = frozenset({"float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"})


def _compare(fn: Callable[..., Array]) -> Evaluator:
    return functools.partial(_comparison, fn)


def _comparison(fn: Callable[..., Array], attrs: Any, args: Sequence[Array]) -> Array | None:
    a, b = args
    if str(a.dtype) not in _COMPARABLE or b.dtype != a.dtype:
        return None
    result: Array = fn(a, b)
    return result


def _repeat(attrs: Any, args: Sequence[Array]) -> Array:
    (x,) = args
    return np.repeat(x, int(attrs.repeats), axis=int(attrs.axis))


def _strided_slice(attrs: Any, args: Sequence[Array]) -> Array | None:
    """Relay's ``strided_slice`` for positive strides, where its begin/end rules (negative
    indices count from the end, then both clamp to the axis) are Python's slice rules."""
    (x,) = args
    if str(attrs.slice_mode) != "end" or attrs.begin is None or attrs.end is None:
        return None
    begin, end = [int(b) for b in attrs.begin], [int(e) for e in attrs.end]
    strides = [int(s) for s in attrs.strides] if attrs.strides else []
    axes = [int(a) for a in attrs.axes] if attrs.axes is not None else list(range(len(begin)))
    strides += [1] * (len(axes) - len(strides))  # axes without a stride step by 1
    if not (len(begin) == len(end) == len(strides) == len(axes)) or min(strides, default=1) < 1:
        return None
    index = [slice(None)] * x.ndim
    for axis, start, stop, step in zip(axes, begin, end, strides, strict=True):
        index[axis] = slice(start, stop, step)
    return x[tuple(index)]


def _arange(attrs: Any, args: Sequence[Array]) -> Array | None:
    """``start + step * i``, as TOPI computes it, where that is exact: integer dtypes, or floats
    whose values are integers small enough to be represented exactly (position ids, say)."""
    start, stop, step = (np.asarray(a).reshape(()) for a in args)
    dtype = np.dtype(str(attrs.dtype))
    if any(a.dtype != dtype for a in (start, stop, step)) or step == 0:
        return None
    count = max(int(np.ceil((float(stop) - float(start)) / float(step))), 0)
    index = np.arange(count, dtype=np.int64)
    if dtype.kind in "iu":
        values: Array = (start + step * index.astype(dtype)).astype(dtype)
        return values
    if dtype.kind != "f" or start != np.floor(start) or step != np.floor(step):
        return None
    exact = 2.0 ** (np.finfo(dtype).nmant + 1)
    if max(abs(float(start)), abs(float(start) + float(step) * count)) >= exact:
        return None
    return (float(start) + float(step) * index).astype(dtype)


EVALUATORS: dict[str, Evaluator] = {
    "add": _sum(np.add),
    "subtract": _sum(np.subtract),
    "multiply": _arith(np.multiply),
    "divide": _arith(np.divide),
    "negative": _arith(_negative),
    "sqrt": _arith(np.sqrt),
    "rsqrt": _arith(_rsqrt),
    "expand_dims": _expand_dims,
    "squeeze": _squeeze,
    "transpose": _transpose,
    "reshape": _reshape_like_type,
    "copy": lambda attrs, args: args[0].copy(),
    "nn.batch_flatten": _batch_flatten,
    "broadcast_to": _broadcast_to,
    "full": _full,
    "strided_slice": _strided_slice,
    "repeat": _repeat,
    "take": _take,
    "arange": _arange,
    "where": _where,
    "less": _compare(np.less),
    "greater": _compare(np.greater),
    "less_equal": _compare(np.less_equal),
    "greater_equal": _compare(np.greater_equal),
    "equal": _compare(np.equal),
    "not_equal": _compare(np.not_equal),
    "concatenate": _concatenate,
    "nn.pad": _pad,
    "cast": _cast,
    "layout_transform": _layout_transform,
    "nn.contrib_conv2d_winograd_weight_transform": _winograd_weight_transform,
}


def layout_transform(x: Array, src: str, dst: str) -> Array | None:
    """Relay's ``layout_transform`` in numpy, zero-padding split axes as TOPI does."""
    src_axes, dst_axes = _parse_layout(src), _parse_layout(dst)
    if src_axes is None or dst_axes is None or len(src_axes) != x.ndim:
        return None
    src_primals = [name for name, factor in src_axes if factor is None]
    dst_primals = [name for name, factor in dst_axes if factor is None]
    if sorted(src_primals) != sorted(dst_primals):
        return None
    # 1. Merge each split axis of the source back into its primal axis.
    order: list[int] = []
    merged: list[int] = []
    for name in src_primals:
        outer = src_axes.index((name, None))
        inner = [i for i, (n, f) in enumerate(src_axes) if f is not None and n == name.lower()]
        order += [outer, *inner]
        merged.append(int(np.prod([x.shape[i] for i in [outer, *inner]])))
    y = x.transpose(order).reshape(merged)
    # 2. Primal axes into the destination's order.
    y = y.transpose([src_primals.index(name) for name in dst_primals])
    # 3. Pad each axis the destination splits to a multiple of its factor, then split.
    factors = {n.upper(): f for n, f in dst_axes if f is not None}
    pads = [(0, -y.shape[k] % factors.get(name, 1)) for k, name in enumerate(dst_primals)]
    if any(hi for _, hi in pads):
        y = np.pad(y, pads)
    split_shape: list[int] = []
    position: dict[tuple[str, int | None], int] = {}
    for k, name in enumerate(dst_primals):
        factor = factors.get(name)
        position[(name, None)] = len(split_shape)
        if factor is None:
            split_shape.append(y.shape[k])
        else:
            split_shape += [y.shape[k] // factor, factor]
            position[(name.lower(), factor)] = len(split_shape) - 1
    y = y.reshape(split_shape)
    return contiguous(y.transpose([position[axis] for axis in dst_axes]))


def _parse_layout(layout: str) -> list[tuple[str, int | None]] | None:
    axes: list[tuple[str, int | None]] = []
    digits = ""
    for char in layout:
        if char.isdigit():
            digits += char
        elif char.isupper() and not digits:
            axes.append((char, None))
        elif char.islower() and digits:
            axes.append((char, int(digits)))
            digits = ""
        else:
            return None
    names = [n for n, _ in axes]
    if digits or len(set(names)) != len(names):
        return None
    # Every split axis needs its primal axis.
    if any(f is not None and (n.upper(), None) not in axes for n, f in axes):
        return None
    return axes


def _has_nan(a: Array) -> bool:
    return a.dtype.kind == "f" and bool(a.size) and bool(np.isnan(a.max()))


#: Ops that only move elements: their NaNs keep their bits here as in TVM's loads and stores, so
#: their inputs are not scanned for NaN (a pass over every weight: 50 ms on BERT-base).
_MOVES = frozenset(
    {
        "expand_dims",
        "squeeze",
        "transpose",
        "reshape",
        "copy",
        "nn.batch_flatten",
        "broadcast_to",
        "strided_slice",
        "repeat",
        "take",
        "concatenate",
        "layout_transform",
    }
)


def evaluate_call(call: relay.Call, args: Sequence[Array], ttype: Any = None) -> Array | None:
    """The value of ``call`` (whose arguments are the constants ``args``), or None.

    None means TVM must evaluate it: no evaluator, NaN inputs to anything but a move, or a result
    whose shape or dtype differs from the call's type (``ttype``, inferred here when not given).
    """
    name = op_name(call.op)
    evaluator = EVALUATORS.get(name)
    if evaluator is None:
        return None
    if name not in _MOVES and any(_has_nan(a) for a in args):
        return None
    try:
        result = evaluator(call.attrs, args)
    except (ValueError, TypeError, IndexError):
        return None
    if result is None:
        return None
    if ttype is None:
        ttype = _known_type(call)
    if not isinstance(ttype, relay.TensorType) or str(ttype.dtype) != str(result.dtype):
        return None
    shape = tuple(int(d) for d in ttype.shape)
    if result.size != int(np.prod(shape)) or (result.shape != shape and name != "reshape"):
        return None
    if not result.flags.c_contiguous:
        result = contiguous(result)
    return result.reshape(shape)


#: Inside the pipeline, fold results at least this large are not computed until something reads
#: them.
DEFER_MIN_ELEMENTS = 4096


def prefold_function(func: relay.Function, *, defer: bool = False) -> tuple[relay.Function, bool]:
    """Replace each call that numpy can evaluate (all args constant) by its value; also tell
    whether the result still has anything TVM's ``FoldConstant`` rewrites.

    With ``defer`` (and inside :func:`deferred_placeholders`), large results are not computed:
    the call becomes a constant of the right type whose buffer is filled only when something
    reads it. Most of a model's folded weights (a transformer's transposed matrices, a CNN's
    scaled and re-laid-out kernels) only ever become arguments of fused functions: no task
    contains them, and computing them was a third of a transformer's extraction.
    """
    return _Prefolder(defer).fold(func)


class _Deferred:
    """The deferred results of one extraction: each placeholder still unfilled, and how to
    compute it, by the address of its buffer (passes rebuild Constant nodes around the same
    arrays; the placeholders are kept alive here, so no address is reused meanwhile)."""

    def __init__(self) -> None:
        self.unfilled: dict[int, relay.Constant] = {}
        self.compute: dict[int, Callable[[], Array]] = {}


_DEFERRED: ContextVar[_Deferred | None] = ContextVar("relay_tasks_deferred", default=None)


@contextlib.contextmanager
def deferred_placeholders() -> Iterator[dict[int, relay.Constant]]:
    """Allow folds to defer large results while this is open; yields the placeholders still
    unfilled, for :func:`refuse_placeholders` to check once the module is fused.

    Whoever runs passes in between must fill what they read: :func:`fill_all` before a pass
    that may read constant values, :func:`fill_within` for the part of a graph a pass sees,
    :func:`filled_on_read` around Python hooks.
    """
    deferred = _Deferred()
    token = _DEFERRED.set(deferred)
    try:
        yield deferred.unfilled
    finally:
        _DEFERRED.reset(token)


def _raw_data(const: relay.Constant) -> tvm.nd.NDArray:
    """A constant's NDArray, read without filling it (see :func:`filled_on_read`)."""
    data: tvm.nd.NDArray = Object.__getattr__(const, "data")
    return data


def fill(const: relay.Constant) -> None:
    """Compute ``const``'s value now if it is a deferred placeholder."""
    deferred = _DEFERRED.get()
    if deferred is None or not deferred.compute:
        return
    data = _raw_data(const)
    key = _buffer(data)
    compute = deferred.compute.pop(key, None)
    if compute is not None:
        data.copyfrom(compute())
        deferred.unfilled.pop(key, None)


def fill_all() -> None:
    """Compute every deferred value: before anything that may read any constant."""
    deferred = _DEFERRED.get()
    if deferred is None:
        return
    for const in list(deferred.unfilled.values()):
        fill(const)


def fill_within(mod: tvm.IRModule) -> tvm.IRModule:
    """Compute the deferred values among ``mod``'s constants (what a pass given ``mod`` sees);
    returns ``mod``."""
    deferred = _DEFERRED.get()
    if deferred is not None and deferred.compute:
        for func in mod.functions.values():
            relay.analysis.post_order_visit(func, _fill_if_constant)
    return mod


def _fill_if_constant(node: Any) -> None:
    if isinstance(node, relay.Constant):
        fill(node)


def _filled_data(const: relay.Constant) -> tvm.nd.NDArray:
    fill(const)
    return _raw_data(const)


def filled_on_read() -> contextlib.AbstractContextManager[None]:
    """Make every read of a Relay constant's ``data`` from Python fill it first: for passes
    that call Python hooks (layout hooks are given the weights, and some read them). Each
    thread fills from its own extraction's placeholders; outside one, reads are as before."""
    return patched(relay.Constant, "data", _FILLED_DATA)


_FILLED_DATA = property(_filled_data)


def refuse_placeholders(fused: tvm.IRModule, unfilled: Mapping[int, relay.Constant]) -> None:
    """Fail loudly if a placeholder that was never filled sits inside a primitive function:
    lowering would read its uninitialised buffer into the task (constants are linked into fused
    functions only with ``link-params``, when nothing is deferred; this guards that rule)."""
    if not unfilled:
        return
    # By buffer, not by node: FuseOps rebuilds the Constant nodes around the same arrays.
    buffers = {_buffer(_raw_data(const)) for const in unfilled.values()}
    found: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, relay.Function) and is_primitive_task(node):
            inner: list[Any] = []
            relay.analysis.post_order_visit(node.body, inner.append)
            if any(isinstance(n, relay.Constant) and _buffer(n.data) in buffers for n in inner):
                found.append(str(node.attrs["hash"]) if "hash" in node.attrs else "a function")

    for func in fused.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)
    if found:
        raise ExtractionError(
            f"a constant whose value was deferred and never computed is inside {found[0]}; "
            "relay-tasks would lower an uninitialised buffer (please report this model)"
        )


class _Prefolder:
    def __init__(self, defer: bool) -> None:
        self.deferred = _DEFERRED.get() if defer else None
        self.views: dict[int, Array] = {}
        #: Each constant made, with the type of the call it replaces (see :func:`typed_in_place`).
        self.made: list[tuple[relay.Constant, Any]] = []

    def fold(self, func: relay.Function) -> tuple[relay.Function, bool]:
        """The folded function, and whether it still has anything TVM's FoldConstant rewrites.

        That is False only when none of its nodes is of a kind that pass rewrites
        (conservatively: any ``let``, ``if``, projection of a tuple literal, ``on_device``,
        shape query, primitive function, or op call whose arguments are all constants), so
        that skipping the pass returns what it would.
        """
        reads = reads_of(func)
        if any(_needs_tvm(n) for n in reads.nodes):
            return func, True
        memo: dict[int, relay.Expr] = {}

        def get(expr: Any) -> Any:
            return memo.get(node_key(expr), expr) if isinstance(expr, relay.Expr) else expr

        left = False
        for node in reads.nodes:
            op = reads.op(node) if isinstance(node, relay.Call) else None
            if isinstance(op, tvm.ir.Op):
                new, kept = self._fold_call(node, op, reads.args(node), get)
            else:
                new = rebuild(node, get)
                if new is None:
                    return func, True  # a node kind this folder does not rebuild: all to TVM
                kept = _tvm_rewrites_node(new)
            left = left or kept
            memo[node_key(node)] = new
        return memo[node_key(func)], left

    def _fold_call(
        self,
        original: relay.Call,
        op: tvm.ir.Op,
        old_args: list[relay.Expr],
        get: Callable[[Any], Any],
    ) -> tuple[relay.Expr, bool]:
        """The op call ``original`` (of ``op`` on ``old_args``) with its arguments folded
        (``get``), as a constant where it evaluates; else the call and whether TVM's
        FoldConstant may still rewrite it: it evaluates every op call whose arguments are all
        constants, and looks through ``on_device`` annotations. (Each field is read once: reads
        go through TVM's FFI.)"""
        args = [get(arg) for arg in old_args]
        call = original
        if not all(a.same_as(b) for a, b in zip(args, old_args, strict=True)):
            call = with_children(original, [op, *args])
        operands = _constant_operands(args)
        name = op_name(op)
        if operands is None:
            return call, name == "on_device"
        if name not in EVALUATORS:
            return call, True
        ttype = _known_type(original, call)
        if self.deferred is not None and _is_large(ttype):
            return self._made(self._deferred_constant(self.deferred, call, operands, ttype), ttype)
        values = [self.value_of(c) for c in operands]
        result = evaluate_call(call, values, ttype)
        if result is None:
            return call, True
        for const, value in zip(operands, values, strict=True):
            if _same_buffer(result, value):  # a reshape, say: the operand's bytes, reshaped
                return self._made(relay.Constant(const.data._create_view(result.shape)), ttype)
        return self._made(relay.Constant(as_ndarray(result)), ttype)

    def _made(self, const: relay.Constant, ttype: Any) -> tuple[relay.Expr, bool]:
        self.made.append((const, ttype))
        return const, False

    def _deferred_constant(
        self, deferred: _Deferred, call: relay.Call, operands: list[relay.Constant], ttype: Any
    ) -> relay.Constant:
        shape = [int(d) for d in ttype.shape]
        const = relay.Constant(tvm.nd.empty(shape, str(ttype.dtype)))

        def compute() -> Array:
            result = evaluate_call(call, [self.value_of(c) for c in operands], ttype)
            if result is None:  # numpy declines (NaN, say): TVM computes it after all
                result = _fold_with_tvm(call)
            return result

        key = _buffer(_raw_data(const))
        deferred.compute[key] = compute
        deferred.unfilled[key] = const
        return const

    def value_of(self, const: relay.Constant) -> Array:
        fill(const)
        key = node_key(const)
        if key not in self.views:
            self.views[key] = array_view(_raw_data(const))
        return self.views[key]


def _same_buffer(result: Array, operand: Array) -> bool:
    """Whether ``result`` is ``operand``'s buffer, byte for byte, under another shape.

    Such a result becomes a view of the operand's NDArray instead of a copy (BERT-base from
    PyTorch folds each of its 72 weight matrices through a reshape and a broadcast that add a
    batch axis: 650 MB of copies otherwise). Constants are never written to, so sharing is safe.
    """
    return (
        result.flags.c_contiguous
        and operand.flags.c_contiguous
        and result.dtype == operand.dtype
        and result.nbytes == operand.nbytes > 0
        and result.ctypes.data == operand.ctypes.data
    )


def _is_large(ttype: Any) -> bool:
    if not isinstance(ttype, relay.TensorType):
        return False
    dims = [d for d in ttype.shape]
    if not all(isinstance(d, tvm.tir.IntImm) for d in dims):
        return False
    return int(np.prod([int(d) for d in dims])) >= DEFER_MIN_ELEMENTS


def _buffer(data: tvm.nd.NDArray) -> int:
    """The address of an NDArray's bytes: the identity of what a constant holds."""
    return int(data.handle.contents.data or 0)


def array_view(data: tvm.nd.NDArray) -> Array:
    """The constant's data as numpy, without copying where DLPack allows."""
    try:
        return np.asarray(np.from_dlpack(data))
    except (RuntimeError, TypeError, BufferError):
        return np.asarray(data.numpy())  # dtypes DLPack export does not cover (bool)


def folded_call(call: relay.Call) -> relay.Constant:
    """What TVM's ``FoldConstantExpr`` makes of ``call``, an op call on constants: its value
    computed here where an evaluator covers it, else by TVM (deferred operands are computed)."""
    operands = _constant_operands(list(call.args))
    if operands is not None:
        result = evaluate_call(call, [array_view(_filled_data(c)) for c in operands])
        if result is not None:
            return relay.Constant(as_ndarray(result))
    for const in operands or ():
        fill(const)
    return _folded_by_tvm(call)


def _folded_by_tvm(call: relay.Call) -> relay.Constant:
    folded: relay.Constant = _FOLD_CONSTANT_EXPR(call, tvm.IRModule(), False)
    return folded


_FOLD_CONSTANT_EXPR = tvm.get_global_func("relay._transform.FoldConstantExpr")


def _fold_with_tvm(call: relay.Call) -> Array:
    return np.asarray(_folded_by_tvm(call).data.numpy())


def _known_type(node: relay.Expr, rebuilt: relay.Expr | None = None) -> Any:
    """The type inference gave ``node``, or else the type inferred now for ``rebuilt`` (the same
    call with constant arguments, which is cheap to type)."""
    try:
        return node.checked_type
    except ValueError:
        try:
            return relay.transform.InferTypeLocal(node if rebuilt is None else rebuilt)
        except tvm.TVMError:
            return None


def _constant_operands(args: Sequence[relay.Expr]) -> list[relay.Constant] | None:
    """A call's arguments when all are constants (tuples of constants flattened; Relay's
    types allow nested ones in no op this folder evaluates)."""
    if not args:
        return None
    flat: list[relay.Constant] = []
    pending = list(reversed(args))
    while pending:
        arg = pending.pop()
        if isinstance(arg, relay.Tuple):
            pending.extend(reversed(arg.fields))
        elif isinstance(arg, relay.Constant):
            flat.append(arg)
        else:
            return None
    return flat


_TYPE_DEPENDENT_OPS = frozenset({"shape_of", "vm.shape_of", "ndarray_size"})


def _needs_tvm(node: Any) -> bool:
    """Graph features whose folding depends on more than values: left entirely to TVM.

    FoldConstant never folds inside primitive functions, and it folds ``shape_of`` from the types
    of the original nodes, which a rebuilt graph would not carry.
    """
    if isinstance(node, relay.Function):
        attrs = node.attrs
        return attrs is not None and "Primitive" in attrs and int(attrs["Primitive"]) != 0
    return isinstance(node, tvm.ir.Op) and node.name in _TYPE_DEPENDENT_OPS


def links_params(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> bool:
    """Whether FuseOps will put constants inside the fused functions, decided as FuseOps decides:
    ``relay.FuseOps.link_params`` if set, else the module's executor's ``link-params``."""
    configured = ctx.config.get("relay.FuseOps.link_params")
    if configured is not None:
        return bool(configured)
    executor = mod.get_attr("executor")
    attrs = executor.attrs if executor is not None else None
    return attrs is not None and "link-params" in attrs and bool(attrs["link-params"])


def fold_module(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """:class:`FoldConstant`'s work: every Relay function prefolded in numpy, then TVM's fold
    where anything is left for it (after computing every deferred value: it may read any)."""
    defer = not links_params(mod, ctx)
    updates = {}
    left_for_tvm = False
    made: list[tuple[relay.Constant, Any]] = []
    for gvar, func in mod.functions.items():
        if isinstance(func, relay.Function):
            prefolder = _Prefolder(defer)
            folded, left = prefolder.fold(func)
            left_for_tvm = left_for_tvm or left
            if not folded.same_as(func):
                updates[gvar] = folded
                made += prefolder.made
    if left_for_tvm:
        fill_all()
        return relay.transform.FoldConstant()(with_functions(mod, updates))
    return only_typed(with_functions(mod, updates), made)


def typed_in_place(made: Sequence[tuple[relay.Constant, Any]]) -> bool:
    """Type each new constant in place, if each has exactly the type of the call it replaced
    (the call's type from the last inference, or None when it had none); False when one does
    not, and the module must be typed again.

    When every replacement keeps its type, type inference over the whole module would give
    every other node the type it already has: the rebuilt nodes (:func:`~relay_tasks.ir.
    with_children`) keep theirs, and each relation sees the same argument types. Typing only
    the new constants saves that pass: 12 ms of the ONNX BERT's last fold, 40 ms on a ResNet-50
    from ONNX. A shape whose dimensions were typed as 64-bit integers (a constant's are 32-bit)
    is not the same type: those modules are typed again in full.
    """
    for const, replaced in made:
        if replaced is None:
            return False
        if not tvm.ir.structural_equal(relay.transform.InferTypeLocal(const), replaced):
            return False
    return True


def only_typed(mod: tvm.IRModule, made: Sequence[tuple[relay.Constant, Any]]) -> tvm.IRModule:
    """What TVM's FoldConstant returns for a module it finds nothing to rewrite in: each function
    as the numpy folder left it (``made``: the constants it put in), then the module typed, as
    every Relay function pass ends. Re-typing is saved where the module is already typed and
    the new constants can be typed in place (:func:`typed_in_place`); a quarter of a
    transformer's extraction was TVM's pass compiling the one integer add the folder left it."""
    if _typed(mod) and typed_in_place(made):
        return mod
    return relay.transform.InferType()(mod)


def _typed(mod: tvm.IRModule) -> bool:
    """Whether every Relay function of ``mod`` is typed: type inference ran on it, or it was
    rebuilt from one it ran on (``WithFields`` keeps each node's type) with every node it added
    typed in place (nodes are immutable, so a typed function stays typed)."""
    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            try:
                func.checked_type  # noqa: B018 (raises when the function was never typed)
            except ValueError:
                return False
    return True


def _tvm_rewrites_node(node: Any) -> bool:
    """A non-call node TVM's FoldConstant may rewrite: a ``let`` (constants are inlined), an
    ``if`` (a constant condition picks a branch), a projection of a tuple literal."""
    if isinstance(node, (relay.Let, relay.If)):
        return True
    return isinstance(node, relay.TupleGetItem) and isinstance(node.tuple_value, relay.Tuple)


# The pass decorator replaces the class, which mutation tools cannot instrument: the work is in
# fold_module.
@tvm.transform.module_pass(opt_level=2, name="FoldConstant")
class FoldConstant:  # pragma: no mutate block
    """Drop-in for ``relay.transform.FoldConstant()``: numpy first, TVM for what remains.

    Inside :func:`deferred_placeholders`, large results are deferred (see
    :func:`prefold_function`), unless FuseOps will link constants into the fused functions
    (``relay.FuseOps.link_params``).
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fold_module(mod, ctx)
