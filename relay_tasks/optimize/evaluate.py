"""The values numpy computes for constant calls, bit-identical to what TVM's compiled code gives.

One evaluator per operator (:data:`EVALUATORS`), each declining (None) where it cannot promise
TVM's exact bits: a dtype whose arithmetic it does not own, a NaN input to anything but an op
that only moves elements, an integer sum that overflows, a result whose shape or dtype is not the
one Relay inferred. The arrays it makes are laid out as TVM's NDArrays want them (aligned,
contiguous), so they become Relay constants without a copy.
"""

from __future__ import annotations

import functools
import mmap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import tvm
from tvm import relay

from ..ir import op_name

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


def _floored(fn: Callable[..., Array]) -> Evaluator:
    return functools.partial(_floored_integers, fn)


def _floored_integers(fn: Callable[..., Array], attrs: Any, args: Sequence[Array]) -> Array | None:
    """Integer ``floor_divide`` and ``floor_mod`` (the frontends' shape arithmetic: a head size
    from a width): numpy floors as TIR's ``floordiv`` and ``floormod`` do. A zero divisor and
    the least value divided by -1 have no defined value in LLVM's code; floats round through a
    division numpy does not do the same way: all of those go to TVM."""
    a, b = args
    if str(a.dtype) not in _INT_DTYPES or b.dtype != a.dtype:
        return None
    least = np.iinfo(a.dtype).min
    if np.any(b == 0) or np.any((a == least) & (b == -1)):
        return None
    out = aligned_empty(np.broadcast_shapes(a.shape, b.shape), a.dtype)
    fn(a, b, out=out)
    return out


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
        with np.errstate(over="ignore"):  # beyond the narrower float: infinity, as in LLVM
            return x.astype(dtype)
    if src in _INTEGERS and (dtype in _INTEGERS or dtype in ("float32", "float64")):
        return x.astype(dtype)
    if src in ("float32", "float64") and dtype in _INTEGERS and _truncates_into(x, dtype):
        return x.astype(dtype)
    return None


def _truncates_into(x: Array, dtype: str) -> bool:
    """Whether every element of ``x`` truncates toward zero to a value of ``dtype``: there
    LLVM's conversion (fptosi, fptoui) and numpy's agree; outside, LLVM's has no defined value."""
    if not x.size:
        return True
    info = np.iinfo(dtype)
    with np.errstate(invalid="ignore"):
        low, high = np.trunc(x.min()), np.trunc(x.max())
    return bool(np.isfinite(low) and np.isfinite(high) and info.min <= low and high <= info.max)


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


def _full_like(attrs: Any, args: Sequence[Array]) -> Array | None:
    """TOPI's ``full_like``: the fill value cast to the data's dtype, in the data's shape."""
    data, fill = args
    value = _exact_cast(fill, str(data.dtype)) if fill.ndim == 0 else None
    if value is None:
        return None
    return np.full(data.shape, value, dtype=value.dtype)


def _trilu(attrs: Any, args: Sequence[Array]) -> Array | None:
    """TOPI's ``trilu``: the elements on and above (``upper``) or below diagonal ``k`` kept,
    the others zero; numpy's ``triu``/``tril`` select the same ones."""
    data, k = args
    if data.ndim < 2 or k.ndim != 0 or k.dtype.kind not in "iu":
        return None
    keep = np.triu if bool(attrs.upper) else np.tril
    return keep(data, int(k))


def _abs(attrs: Any, args: Sequence[Array]) -> Array | None:
    """Floats: the sign bit cleared, as LLVM's fabs does. Integers: TIR's select(x >= 0, x, -x)
    where no element is the most negative value (whose negation has no defined value)."""
    (x,) = args
    if str(x.dtype) in _INT_DTYPES and (not x.size or x.min() > np.iinfo(x.dtype).min):
        return np.abs(x)
    return _elementwise(np.abs, attrs, args)


def _select(pick_first: Callable[[Array, Array], Array]) -> Evaluator:
    """``minimum`` or ``maximum``: LLVM's code for TIR's min is select(a < b, a, b) (max: >), so
    of -0.0 and 0.0 the second operand; the same select here, for floats and integers."""

    def evaluate(attrs: Any, args: Sequence[Array]) -> Array | None:
        a, b = args
        if b.dtype != a.dtype or str(a.dtype) not in _ARITH_DTYPES | _INT_DTYPES:
            return None
        return np.where(pick_first(a, b), a, b)

    return evaluate


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
    "floor_divide": _floored(np.floor_divide),
    "floor_mod": _floored(np.mod),
    "negative": _arith(_negative),
    "abs": _abs,
    "minimum": _select(np.less),
    "maximum": _select(np.greater),
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
    "full_like": _full_like,
    "trilu": _trilu,
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
        "trilu",
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
        ttype = known_type(call)
    if not isinstance(ttype, relay.TensorType) or str(ttype.dtype) != str(result.dtype):
        return None
    shape = tuple(int(d) for d in ttype.shape)
    if result.size != int(np.prod(shape)) or (result.shape != shape and name != "reshape"):
        return None
    if not result.flags.c_contiguous:
        result = contiguous(result)
    return result.reshape(shape)


def known_type(node: relay.Expr, rebuilt: relay.Expr | None = None) -> Any:
    """The type inference gave ``node``, or else the type inferred now for ``rebuilt`` (the same
    call with constant arguments, which is cheap to type)."""
    try:
        return node.checked_type
    except ValueError:
        try:
            return relay.transform.InferTypeLocal(node if rebuilt is None else rebuilt)
        except tvm.TVMError:
            return None
