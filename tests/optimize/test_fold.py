"""The numpy constant folder: bit-identical to TVM's FoldConstant, and it never compiles.

Property tests build random constant calls of every covered op and compare our value with what
TVM's own ``FoldConstantExpr`` computes (an LLVM build per example, hence the modest default
budget; set ``RELAY_TASKS_FOLD_EXAMPLES`` for more).
"""

from __future__ import annotations

import operator
import os
from typing import Any

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tvm import relay
from tvm.ir.instrument import pass_instrument

from relay_tasks.adapters.meta_schedule import DEFAULT_PASS_CONFIG
from relay_tasks.inputs import as_module
from relay_tasks.optimize import evaluate, fold
from relay_tasks.optimize.evaluate import EVALUATORS, evaluate_call, layout_transform
from relay_tasks.optimize.fold import prefold_function
from relay_tasks.optimize.pipeline import PassSettings, extraction_scope, optimize

from checks import assert_meta_schedule_matches, assert_typed_alike, counting_llvm_builds
from zoo import CUDA, X86, load, model_target_rows

EXAMPLES = int(os.environ.get("RELAY_TASKS_FOLD_EXAMPLES", "20"))
FOLD = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_tvm_fold = tvm.get_global_func("relay._transform.FoldConstantExpr")


def _const(value: np.ndarray) -> relay.Constant:
    """A constant of exactly this dtype (``relay.const`` turns float64 into float32)."""
    return relay.Constant(tvm.nd.array(np.asarray(value)))


def _tvm_value(call: relay.Expr) -> np.ndarray:
    folded = _tvm_fold(call, tvm.IRModule(), False)
    assert isinstance(folded, relay.Constant), "TVM did not fold the call"
    return folded.data.numpy()


def _assert_same_bits(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[ours.dtype.itemsize]
    assert np.array_equal(ours.view(width), theirs.view(width))


def _check(call: relay.Call, args: list[np.ndarray]) -> np.ndarray | None:
    """Our value for ``call`` (None: routed to TVM), checked bit for bit against TVM's."""
    typed = relay.transform.InferTypeLocal(call)
    ours = evaluate_call(call, args, typed)
    if ours is not None:
        _assert_same_bits(ours, _tvm_value(call))
    return ours


def _floats(dtype: str, shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    width = 64 if dtype == "float64" else 32
    values = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 3.4e38, 1e-7]
    special = st.sampled_from([float(np.dtype(dtype).type(v)) for v in values])
    finite = st.floats(-1e6, 1e6, width=width)
    tiny = st.floats(-(2.0**-126), 2.0**-126, width=width, allow_subnormal=True)
    return hnp.arrays(dtype, shape, elements=st.one_of(finite, special, tiny))


shapes = hnp.array_shapes(min_dims=0, max_dims=4, max_side=5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_divide_is_a_division_to_the_last_bit(dtype: str) -> None:
    """Fixed examples where ``a * (1 / b)`` and ``a / b`` differ in the last bit (a quarter of
    random pairs do), so a folder that multiplies by the reciprocal fails every run."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(1000).astype(dtype) for _ in range(2))
    assert np.count_nonzero(a * (np.asarray(1, dtype) / b) != a / b) > 50
    assert _check(relay.divide(_const(a), _const(b)), [a, b]) is not None


@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide"])
@FOLD
@given(
    dtype=st.sampled_from(["float32", "float64"]),
    shape_pair=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
    data=st.data(),
)
def test_binary_arithmetic_is_bit_exact(op, dtype, shape_pair, data) -> None:
    a_shape, b_shape = shape_pair.input_shapes
    a = data.draw(_floats(dtype, a_shape))
    b = data.draw(_floats(dtype, b_shape))
    call = getattr(relay, op)(_const(a), _const(b))
    assert _check(call, [a, b]) is not None


@pytest.mark.parametrize("op", ["negative", "sqrt", "rsqrt"])  # each op its own budget
@FOLD
@given(dtype=st.sampled_from(["float32", "float64"]), shape=shapes, data=st.data())
def test_unary_arithmetic_is_bit_exact(op, dtype, shape, data) -> None:
    x = data.draw(_floats(dtype, shape))
    call = getattr(relay, op)(_const(x))
    assert _check(call, [x]) is not None


@FOLD
@given(
    dtype_op=st.sampled_from(
        [
            ("float16", "add"),
            ("int8", "add"),
            ("uint32", "subtract"),
            ("int32", "multiply"),
            ("int64", "divide"),
        ]
    ),
    shape=shapes,
    data=st.data(),
)
def test_other_dtypes_go_to_tvm(dtype_op, shape, data) -> None:
    dtype, op = dtype_op
    elements = st.floats(-100, 100, width=16) if dtype == "float16" else st.integers(1, 100)
    a = data.draw(hnp.arrays(dtype, shape, elements=elements))
    call = getattr(relay, op)(_const(a), _const(a))
    assert evaluate_call(call, [a, a], relay.transform.InferTypeLocal(call)) is None


def _integers(dtype: str, shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    info = np.iinfo(dtype)
    edges = [info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max]
    small = st.integers(max(info.min, -1000), min(info.max, 1000))
    elements = st.one_of(small, st.sampled_from([e for e in edges if e >= info.min]))
    return hnp.arrays(dtype, shape, elements=elements)


@pytest.mark.parametrize("op", ["add", "subtract"])
@FOLD
@given(
    dtype=st.sampled_from(["int32", "int64"]),
    shape_pair=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4),
    data=st.data(),
)
def test_integer_sums_are_exact_or_left_to_tvm(op, dtype, shape_pair, data) -> None:
    """Integer add and subtract are folded here unless an element overflows, which LLVM's
    no-signed-wrap arithmetic leaves undefined: those go to TVM whatever it makes of them."""
    a_shape, b_shape = shape_pair.input_shapes
    a, b = data.draw(_integers(dtype, a_shape)), data.draw(_integers(dtype, b_shape))
    exact = np.asarray(getattr(operator, op[:3])(a.astype(object), b.astype(object)))
    info = np.iinfo(dtype)
    overflows = bool(np.any((exact < info.min) | (exact > info.max)))
    call = getattr(relay, op)(_const(a), _const(b))
    ours = evaluate_call(call, [a, b], relay.transform.InferTypeLocal(call))
    assert (ours is None) == overflows
    if ours is not None:
        _assert_same_bits(ours, _tvm_value(call))
        assert np.array_equal(ours, exact.astype(dtype))


def _nans(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values with NaNs of several bit patterns: quiet and signalling, either sign, payloads."""
    width = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}[dtype]
    bits = np.arange(int(np.prod(shape)), dtype=np.float64).astype(dtype).view(width).copy()
    info = np.finfo(dtype)
    exponent = ((1 << info.nexp) - 1) << info.nmant
    sign = 1 << (info.bits - 1)
    patterns = [exponent | 1, exponent | (1 << (info.nmant - 1)), sign | exponent | 5,
                exponent | ((1 << info.nmant) - 1)]  # fmt: skip
    for i, pattern in enumerate(patterns):
        bits.flat[(i * 3) % bits.size] = pattern
    return bits.view(dtype).reshape(shape)


def _moves(x: np.ndarray) -> dict[str, tuple[relay.Call, list[np.ndarray]]]:
    """A call of each op that only moves elements, on ``x`` (2, 3, 4), with its operands."""
    c, wide, indices = _const(x), x[None], np.array([1, 0, 1], "int32")
    return {
        "expand_dims": (relay.expand_dims(c, 1), [x]),
        "squeeze": (relay.squeeze(_const(wide), [0]), [wide]),
        "transpose": (relay.transpose(c, [2, 0, 1]), [x]),
        "reshape": (relay.reshape(c, (4, -1)), [x]),
        "copy": (relay.copy(c), [x]),
        "nn.batch_flatten": (relay.nn.batch_flatten(c), [x]),
        "broadcast_to": (relay.broadcast_to(c, (2, 2, 3, 4)), [x]),
        "strided_slice": (relay.strided_slice(c, [0, 1, 0], [2, 3, 4], [1, 1, 2]), [x]),
        "repeat": (relay.repeat(c, 2, 1), [x]),
        "take": (relay.take(c, _const(indices), axis=2), [x, indices]),
        "concatenate": (relay.concatenate([c, c], 0), [x, x]),
        "layout_transform": (relay.layout_transform(c, "CHW", "CHW2c"), [x]),
    }


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_moves_keep_every_nan_bit_as_tvm_does(dtype: str) -> None:
    """Ops that only move elements are folded even with NaN inputs: each NaN's bits (quiet or
    signalling, sign, payload) come out as TVM's loads and stores leave them."""
    x = _nans(dtype, (2, 3, 4))
    assert np.isnan(x).sum() == 4
    moves = _moves(x)
    assert set(moves) == set(evaluate._MOVES)
    for name, (call, args) in moves.items():
        assert _check(call, args) is not None, name


def test_nan_inputs_go_to_tvm() -> None:
    a = np.array([1.0, np.nan], "float32")
    call = relay.add(_const(a), _const(a))
    assert evaluate_call(call, [a, a], relay.transform.InferTypeLocal(call)) is None


@FOLD
@given(x=_floats("float32", (2, 1, 3, 1)), axis=st.integers(-5, 4), count=st.integers(1, 2))
def test_expand_dims(x, axis, count) -> None:
    assert _check(relay.expand_dims(_const(x), axis, count), [x]) is not None


@FOLD
@given(x=_floats("float32", (1, 3, 1, 2)), axis=st.sampled_from([None, [0], [2], [0, 2], [-2]]))
def test_squeeze(x, axis) -> None:
    assert _check(relay.squeeze(_const(x), axis), [x]) is not None


@FOLD
@given(
    x=_floats("float32", (2, 3, 4)), axes=st.sampled_from([None, [1, 0, 2], [2, 0, 1], [0, -1, 1]])
)
def test_transpose(x, axes) -> None:
    assert _check(relay.transpose(_const(x), axes), [x]) is not None


@FOLD
@given(
    x=_floats("float32", (2, 3, 4)),
    newshape=st.sampled_from([(24,), (-1,), (0, -1), (4, 0, -1), (-3, 4), (2, -4, 1, 3, 4), (-2,)]),
)
def test_reshape_with_special_codes(x, newshape) -> None:
    assert _check(relay.reshape(_const(x), newshape), [x]) is not None


@FOLD
@given(
    parts=st.lists(_floats("float32", (2, 3)), min_size=1, max_size=3),
    axis=st.sampled_from([0, 1, -1]),
)
def test_concatenate(parts, axis) -> None:
    call = relay.concatenate([_const(p) for p in parts], axis)
    assert _check(call, parts) is not None


@FOLD
@given(
    x=_floats("float32", (2, 3)),
    widths=st.tuples(
        st.tuples(st.integers(0, 2), st.integers(0, 2)),
        st.tuples(st.integers(0, 2), st.integers(0, 2)),
    ),
    value=st.floats(-2, 2, width=32),
)
def test_pad(x, widths, value) -> None:
    call = relay.nn.pad(_const(x), widths, _const(np.float32(value)))
    assert _check(call, [x, np.asarray(value, "float32")]) is not None


@FOLD
@given(
    src=st.sampled_from(["float16", "float32", "float64"]),
    dst=st.sampled_from(["float16", "float32", "float64"]),
    data=st.data(),
)
def test_float_casts(src, dst, data) -> None:
    x = data.draw(hnp.arrays(src, (3, 4), elements=st.floats(-65504, 65504, width=16)))
    ours = _check(relay.cast(_const(x), dst), [x])
    assert (ours is None) == ((src, dst) == ("float64", "float16"))


@pytest.mark.parametrize(
    ("src", "dst", "shape"),
    [
        ("NCHW", "NCHW16c", (1, 32, 5, 5)),
        ("NCHW", "NCHW16c", (1, 3, 4, 4)),  # C=3 is zero-padded up to 16
        ("NCHW16c", "NCHW", (1, 2, 3, 3, 16)),
        ("OIHW", "OIHW16i16o", (32, 16, 3, 3)),
        ("OIHW", "OIHW4i8o", (8, 6, 1, 1)),
        ("NHWC", "NCHW", (1, 4, 5, 3)),
        ("HWIO", "OIHW", (3, 3, 4, 8)),
        ("OIHW", "HWOI", (8, 4, 3, 3)),
        ("NCHW4c", "NCHW8c", (1, 4, 2, 2, 4)),
        ("OIHW", "OIHW1i4o", (6, 3, 1, 1)),  # O=6 padded to 8
    ],
)
def test_layout_transforms(src: str, dst: str, shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    call = relay.layout_transform(_const(x), src, dst)
    ours = _check(call, [x])
    assert ours is not None
    assert layout_transform(x, src, dst) is not None


@pytest.mark.parametrize("bad", ["NC16", "NCHWc", "NC4HW", "NCHW4c4c", "NCHW4d", "NCCW", "NCHW4C"])
def test_layouts_this_folder_cannot_read_are_left_to_tvm(bad: str) -> None:
    """Digits without a split axis, a split axis without digits or without its primal axis, an
    axis twice: not folded here, whichever side of the transform they are on."""
    x = np.zeros((1, 2, 3, 4), "float32")
    assert layout_transform(x, bad, "NCHW") is None
    assert layout_transform(x, "NCHW", bad) is None
    assert layout_transform(x, "NCHW", "NCHW4c") is not None


@pytest.mark.parametrize(
    ("tile", "kernel", "folded"),
    [(8, 3, True), (2, 7, True), (9, 3, False), (1, 3, False), (2, 8, False), (2, 2, False)],
)
def test_winograd_weight_transform_covers_what_topi_computes(tile, kernel, folded) -> None:
    """The sizes TOPI's Cook-Toom matrices cover are folded here, bit for bit; past them TVM
    fails too, so declining loses nothing."""
    w = np.random.default_rng(kernel).standard_normal((2, 2, kernel, kernel)).astype("float32")
    call = relay.nn.contrib_conv2d_winograd_weight_transform(_const(w), tile)
    typed = relay.transform.InferTypeLocal(call)
    if folded:
        assert _check(call, [w]) is not None
    else:
        assert evaluate_call(call, [w], typed) is None
        with pytest.raises(Exception, match="(?i)support|interpolation|points|tile"):
            _tvm_value(call)
    square = np.zeros((2, 2, 3, 5), "float32")
    sq_call = relay.nn.contrib_conv2d_winograd_weight_transform(_const(square), 2)
    assert evaluate_call(sq_call, [square], relay.transform.InferTypeLocal(sq_call)) is None


@pytest.mark.parametrize(("tile", "kernel"), [(2, 3), (4, 3), (6, 3), (2, 5)])
def test_winograd_weight_transform(tile: int, kernel: int) -> None:
    # (TVM's own evaluation of large tiles with 5x5 kernels takes minutes to compile.)
    rng = np.random.default_rng(tile * 10 + kernel)
    for scale in (1e-3, 1.0, 1e3):
        w = (rng.standard_normal((8, 4, kernel, kernel)) * scale).astype("float32")
        call = relay.nn.contrib_conv2d_winograd_weight_transform(_const(w), tile)
        assert _check(call, [w]) is not None


_INTS = ["int8", "int32", "int64", "uint8"]


def _ints(dtype: str, shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    info = np.iinfo(dtype)
    return hnp.arrays(dtype, shape, elements=st.integers(int(info.min), int(info.max)))


@FOLD
@given(
    src=st.sampled_from(_INTS), dst=st.sampled_from([*_INTS, "float32", "float64"]), data=st.data()
)
def test_integer_casts(src, dst, data) -> None:
    """Integers wrap into narrower integers and round to nearest into floats, extremes too."""
    x = data.draw(_ints(src, (3, 5)))
    assert _check(relay.cast(_const(x), dst), [x]) is not None


@FOLD
@given(
    data=st.data(), shapes=hnp.mutually_broadcastable_shapes(num_shapes=1, max_dims=4, max_side=4)
)
def test_broadcast_to(data, shapes) -> None:
    (shape,) = shapes.input_shapes
    x = data.draw(_floats("float32", shape))
    call = relay.broadcast_to(_const(x), shapes.result_shape)
    assert _check(call, [x]) is not None


@FOLD
@given(
    fill=st.sampled_from(
        [np.float32(1.5), np.float32(-0.0), np.int64(-7), np.int32(2**31 - 1), np.float64(0.1)]
    ),
    dtype=st.sampled_from([None, "float32", "int32", "int64", "float64"]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
)
def test_full(fill, dtype, shape) -> None:
    value = np.asarray(fill)
    call = relay.full(_const(value), shape, dtype or "")
    ours = _check(call, [value])
    # A fill reaching its dtype through a float-to-integer conversion is TVM's to do.
    assert (ours is None) == (value.dtype.kind == "f" and dtype in ("int32", "int64"))


@FOLD
@given(
    x=_floats("float32", (4, 5, 6)),
    begin=st.lists(st.integers(-8, 8), min_size=1, max_size=3),
    end=st.lists(st.integers(-8, 2**31), min_size=1, max_size=3),
    strides=st.sampled_from([None, [1], [2], [2, 3], [1, 2, 3], [-1]]),
    data=st.data(),
)
def test_strided_slice(x, begin, end, strides, data) -> None:
    rank = min(len(begin), len(end))
    axes = data.draw(st.sampled_from([None, [2, 0, 1][:rank], list(range(rank))]))
    if strides is not None:
        strides = strides[:rank]
    call = relay.strided_slice(_const(x), begin[:rank], end[:rank], strides, axes)
    try:
        relay.transform.InferTypeLocal(call)
    except tvm.TVMError:
        return  # an empty or invalid slice: Relay rejects it before any folding
    ours = _check(call, [x])
    assert (ours is None) == (strides == [-1])


@pytest.mark.parametrize(
    ("begin", "end", "strides", "axes"),
    [
        ([0, 0, 0], [2, 3, 4], None, None),
        ([-3], [-1], None, None),
        ([1, -5], [2**31 - 1, 4], [1, 2], None),
        ([0], [9223372036854775807], [2], [2]),  # int64 max: "to the end", as frontends write
        ([-100, 1], [3, 100], [3, 1], [1, 0]),
        ([1, 1, 1], [4, 5, 6], [3, 2, 5], None),
        ([0, 0], [0, -1], [2], None),  # one stride for two axes: the second steps by 1
    ],
)
def test_strided_slice_cases(begin, end, strides, axes) -> None:
    x = np.arange(120, dtype="float32").reshape(4, 5, 6)
    call = relay.strided_slice(_const(x), begin, end, strides, axes)
    assert _check(call, [x]) is not None


@FOLD
@given(x=_floats("float32", (2, 3)), repeats=st.integers(1, 3), axis=st.integers(-2, 1))
def test_repeat(x, repeats, axis) -> None:
    assert _check(relay.repeat(_const(x), repeats, axis), [x]) is not None


@FOLD
@given(
    x=_floats("float32", (4, 3)),
    indices=hnp.arrays("int32", (2, 2), elements=st.integers(-6, 6)),
    axis=st.sampled_from([None, 0, 1, -1]),
    mode=st.sampled_from(["clip", "wrap", "fast"]),
)
def test_take(x, indices, axis, mode) -> None:
    if mode == "fast":
        indices = np.clip(indices, 0, 2)  # fast mode reads out of bounds otherwise
    call = relay.take(_const(x), _const(indices), axis, mode=mode)
    ours = _check(call, [x, indices])
    assert (ours is None) == (mode != "clip")


@FOLD
@given(
    condition=_floats("float32", (3, 1)).filter(lambda a: not np.isnan(a).any()),
    x=_floats("float32", (3, 4)),
    y=_floats("float32", (1, 4)),
)
def test_where(condition, x, y) -> None:
    assert (
        _check(relay.where(_const(condition), _const(x), _const(y)), [condition, x, y]) is not None
    )


@pytest.mark.parametrize(
    "op", ["less", "greater", "less_equal", "greater_equal", "equal", "not_equal"]
)
@FOLD
@given(
    dtype=st.sampled_from(["float32", "float64", "int8", "int32", "int64", "uint8", "bool"]),
    shape_pair=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4),
    data=st.data(),
)
def test_comparisons(op, dtype, shape_pair, data) -> None:
    """Causal masks compare position ids; -0.0 and 0.0 compare equal on both sides."""
    a_shape, b_shape = shape_pair.input_shapes
    if dtype.startswith("float"):
        a, b = data.draw(_floats(dtype, a_shape)), data.draw(_floats(dtype, b_shape))
    elif dtype == "bool":
        a, b = data.draw(hnp.arrays(dtype, a_shape)), data.draw(hnp.arrays(dtype, b_shape))
    else:
        a, b = data.draw(_integers(dtype, a_shape)), data.draw(_integers(dtype, b_shape))
    assert _check(getattr(relay, op)(_const(a), _const(b)), [a, b]) is not None


@FOLD
@given(
    dtype=st.sampled_from(["int32", "int64", "float32", "float64"]),
    start=st.integers(-50, 50),
    length=st.integers(1, 40),  # Relay refuses an empty range
    step=st.sampled_from([1, 2, 3, -1, -4, 0.5, 0.1]),
)
def test_arange(dtype: str, start: int, length: int, step: float) -> None:
    """Integral ranges are folded here (GPT-2's position ids), bit for bit; fractional float
    steps go to TVM; integer dtypes only take integral steps."""
    if "int" in dtype and step != int(step):
        return
    stop = start + step * length
    args = [np.asarray(v, dtype=dtype) for v in (start, stop, step)]
    call = relay.arange(*[_const(a) for a in args], dtype=dtype)
    ours = _check(call, args)
    assert (ours is not None) == (step == int(step))


@pytest.mark.parametrize(
    ("dtype", "start", "step", "length"),
    [
        ("int64", 2**53 + 1, 3, 5),  # past float64's integers: computed in int64
        ("float32", 1, 2**22 + 1, 7),  # under 2**25, past 2**24: float32 rounds i * step
        ("float32", 3, 2**23 + 1, 12),
        ("float32", 0.1, 1, 40),  # a fractional start
        ("float32", -5, 1, 10),
        ("float32", 2**24 - 10, 1, 20),  # only the end passes 2**24
        ("float32", 2**24 - 8, 1, 8),  # the end is 2**24 itself
    ],
)
def test_arange_is_folded_only_where_exact(dtype: str, start, step, length: int) -> None:
    """Float ranges whose values pass 2**24 (float32's last exact integer) are TVM's: TOPI
    rounds ``i * step`` in float32 before adding ``start``, numpy would round once."""
    args = [np.asarray(v, dtype=dtype) for v in (start, start + step * length, step)]
    ours = _check(relay.arange(*[_const(a) for a in args], dtype=dtype), args)
    exact = dtype == "int64" or (
        float(start).is_integer() and abs(start) + abs(step) * length < 2**24
    )
    assert (ours is not None) == exact


@pytest.mark.parametrize(
    ("value", "dtype", "exact"),
    [
        (np.float32(1e10), "int32", False),  # float to integer: overflow is the target's
        (np.float64(2.5), "int64", False),
        (np.int32(-3), "float32", True),  # integers round to nearest, as sitofp does
        (np.uint8(200), "float64", True),
        (np.int64(2**40 + 1), "int8", True),  # integers wrap, as trunc does
        (np.int16(7), "float16", False),  # numpy rounds twice on the way
        (np.float64(1.0), "float16", False),  # not TVM's conversion on this build
    ],
)
def test_casts_are_done_here_only_where_numpy_converts_as_tvm_does(value, dtype, exact) -> None:
    from relay_tasks.optimize.evaluate import _exact_cast

    assert (_exact_cast(np.asarray(value), dtype) is not None) == exact


def test_a_result_that_disagrees_with_the_calls_type_is_not_trusted(monkeypatch) -> None:
    """The call's type has the last word: a result of another dtype, or of the right size but
    another shape, is left to TVM (an evaluator bug must not become a wrong constant)."""

    x = np.arange(6, dtype="float32").reshape(2, 3)
    transpose = relay.transpose(_const(x))
    add = relay.add(_const(x), _const(x))
    monkeypatch.setitem(evaluate.EVALUATORS, "transpose", lambda attrs, args: args[0].copy())
    monkeypatch.setitem(evaluate.EVALUATORS, "add", lambda attrs, args: args[0].astype("float64"))
    for call in (transpose, add):
        assert (
            evaluate_call(call, [x] * len(call.args), relay.transform.InferTypeLocal(call)) is None
        )


def test_take_with_batch_dims_and_pad_with_negative_widths_are_left_to_tvm() -> None:
    x = np.arange(24, dtype="float32").reshape(2, 3, 4)
    indices = np.array([[0, 2], [1, 5]], "int32")
    take = relay.take(_const(x), _const(indices), axis=1, batch_dims=1, mode="clip")
    assert _check(take, [x, indices]) is None
    fill = np.asarray(0, "float32")
    for widths in (((0, 0), (-1, 1), (0, 0)), ((0, 0), (1, -1), (0, 0))):
        assert _check(relay.nn.pad(_const(x), widths), [x, fill]) is None
    assert (
        _check(relay.nn.pad(_const(x), ((0, 0), (1, 1), (0, 2)), 2.5), [x, fill + 2.5]) is not None
    )


def test_every_evaluator_is_exercised_here() -> None:
    tested = {
        "add",
        "subtract",
        "multiply",
        "divide",
        "negative",
        "sqrt",
        "rsqrt",
        "expand_dims",
        "squeeze",
        "transpose",
        "reshape",
        "concatenate",
        "nn.pad",
        "cast",
        "layout_transform",
        "nn.contrib_conv2d_winograd_weight_transform",
        "copy",
        "nn.batch_flatten",
        "broadcast_to",
        "full",
        "strided_slice",
        "repeat",
        "take",
        "where",
        "arange",
        "less",
        "greater",
        "less_equal",
        "greater_equal",
        "equal",
        "not_equal",
    }
    assert set(EVALUATORS) <= tested, set(EVALUATORS) - tested


@pytest.mark.parametrize("op", ["copy", "nn.batch_flatten"])
def test_copy_and_batch_flatten(op: str) -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype("float32")
    call = relay.copy(_const(x)) if op == "copy" else relay.nn.batch_flatten(_const(x))
    assert _check(call, [x]) is not None


@pass_instrument
class _CurrentPass:
    def __init__(self) -> None:
        self.stack: list[str] = []

    def run_before_pass(self, mod, info) -> None:
        self.stack.append(str(info.name))

    def run_after_pass(self, mod, info) -> None:
        self.stack.pop()


def _builds_by_pass(model: str, target: str) -> list[str]:
    mod, params = load(model)
    current = _CurrentPass()
    settings = PassSettings(config=dict(DEFAULT_PASS_CONFIG))
    context = tvm.transform.PassContext(3, config=dict(DEFAULT_PASS_CONFIG), instruments=[current])
    with (
        counting_llvm_builds(lambda: current.stack[0] if current.stack else "") as builds,
        extraction_scope(tvm.target.Target(target), settings),
        context,
    ):
        optimize(as_module(mod), params)
    return builds


@pytest.mark.parametrize(
    ("model", "target"), [r for r in model_target_rows() if r.values[0] != "simplify_patterns"]
)
def test_the_pipeline_never_compiles(model: str, target: str) -> None:
    assert _builds_by_pass(model, target) == []


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_tvm_fold_is_skipped_only_where_it_would_just_infer_types(
    model: str, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the numpy folder leaves nothing TVM's FoldConstant rewrites, the pass is skipped
    and the module only typed; on every module where that happens, TVM's pass gives the same,
    and every node has the type that inference over the whole module gives it (also where only
    the new constants were typed)."""
    skipped: list[tuple[tvm.IRModule, tvm.IRModule]] = []

    def spy(mod: tvm.IRModule, made: Any) -> tvm.IRModule:
        result = real(mod, made)
        skipped.append((mod, result))
        return result

    real = fold.only_typed
    monkeypatch.setattr(fold, "only_typed", spy)
    _builds_by_pass(model, target)
    assert skipped
    for mod, result in skipped:
        typed = relay.transform.InferType()(mod)
        assert tvm.ir.structural_equal(relay.transform.FoldConstant()(mod), typed)
        assert_typed_alike(result, typed)


@pass_instrument
class _InferTypeRuns:
    """Counts type inference over the model's module (``main`` has parameters), not over the
    one-constant modules that type a single constant."""

    def __init__(self) -> None:
        self.runs = 0

    def run_before_pass(self, mod, info) -> None:
        self.runs += str(info.name) == "InferType" and len(mod["main"].params) > 0


def _fold_counting_inference(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    counter = _InferTypeRuns()
    with tvm.transform.PassContext(3, instruments=[counter]):
        folded = fold.FoldConstant()(mod)
    return folded, counter.runs


@pytest.mark.parametrize("dims", ["int32", "int64"])
def test_new_constants_are_typed_in_place_where_they_keep_the_replaced_types(dims: str) -> None:
    """A fold whose constants have exactly the types of the calls they replace types them alone
    (inference over the whole module would give every other node the type it has); one whose
    call was typed with 64-bit dimensions (a constant's are 32-bit) types the module again.
    Either way each node has the type that inference over the whole module gives it."""
    rng = np.random.default_rng(9)
    x = relay.var("x", shape=(4, 3))
    w = _const(rng.standard_normal((3, 4)).astype("float32"))
    scale = _const(rng.standard_normal((4,)).astype("float32"))
    shape = [tvm.tir.IntImm(dims, 4), tvm.tir.IntImm(dims, 3)]
    weight = relay.broadcast_to(relay.transpose(w), shape) * relay.expand_dims(scale, 1)
    func = relay.Function([x], relay.nn.relu(relay.add(x, weight)))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    folded, runs = _fold_counting_inference(mod)
    assert isinstance(folded["main"].body.args[0].args[1], relay.Constant)
    assert runs == (dims == "int64")
    assert_typed_alike(folded, relay.transform.InferType()(relay.transform.FoldConstant()(mod)))


def test_an_untyped_module_is_typed_after_the_fold() -> None:
    x = relay.var("x", shape=(2,))
    c = _const(np.array([1.5, -2.0], "float32"))
    mod = tvm.IRModule.from_expr(relay.Function([x], x + relay.negative(c)))
    folded, runs = _fold_counting_inference(mod)
    assert runs == 1
    assert_typed_alike(folded, relay.transform.InferType()(relay.transform.FoldConstant()(mod)))


def _let_constant() -> relay.Function:
    x = relay.var("x", shape=(2,))
    v = relay.var("v", shape=(2,))
    return relay.Function([x], relay.Let(v, _const(np.ones(2, "float32")), x + v))


def _if_constant() -> relay.Function:
    x = relay.var("x", shape=(2,))
    return relay.Function([x], relay.If(_const(np.array(True)), x, relay.negative(x)))


def _projection_of_tuple() -> relay.Function:
    x = relay.var("x", shape=(2,))
    return relay.Function([x], relay.TupleGetItem(relay.Tuple([x, relay.negative(x)]), 1))


def _shape_query(op: str) -> relay.Function:
    x = relay.var("x", shape=(2, 3))
    query = relay.shape_of(x) if op == "shape_of" else relay.ndarray_size(x)
    return relay.Function([x], query)


def _constant_call(op: str) -> relay.Function:
    x = relay.var("x", shape=(2,))
    c = _const(np.array([1.5, -2.0], "float32"))
    if op == "exp":  # no evaluator here
        return relay.Function([x], x + relay.exp(c))
    return relay.Function([x], x + relay.sum(relay.stack([c, c], 0), axis=0))


@pytest.mark.parametrize(
    "build",
    [
        _let_constant,
        _if_constant,
        _projection_of_tuple,
        lambda: _shape_query("shape_of"),
        lambda: _shape_query("ndarray_size"),
        lambda: _constant_call("exp"),
        lambda: _constant_call("concatenate"),
    ],
    ids=["let", "if", "tuple_get_item", "shape_of", "ndarray_size", "call", "tuple_arg"],
)
def test_what_tvm_fold_rewrites_keeps_it(build: Any) -> None:
    """Each kind of node TVM's FoldConstant rewrites makes the gate run it (and it does rewrite:
    its result is not what type inference alone gives)."""
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(build()))
    assert prefold_function(mod["main"])[1]
    folded = relay.transform.FoldConstant()(mod)["main"]
    assert not tvm.ir.structural_equal(folded, mod["main"])


def test_only_simplify_expr_folds_inside_itself() -> None:
    """SimplifyExpr's own rewrites (x + c1) * c2 and x * c1 * c2 fold c1 * c2 with TVM inside
    the C++ pass, out of our reach; on graphs that have them, those are the only builds."""
    builds = _builds_by_pass("simplify_patterns", X86)
    assert builds and set(builds) == {"SimplifyExpr"}


def test_uncovered_ops_fall_back_to_tvm_and_agree() -> None:
    x = np.linspace(-3, 3, 12, dtype="float32").reshape(3, 4)
    body = relay.exp(_const(x)) * _const(np.float32(2.0))
    func = relay.Function([], body)
    with counting_llvm_builds() as builds:
        ours = fold.FoldConstant()(tvm.IRModule.from_expr(func))
    theirs = relay.transform.FoldConstant()(tvm.IRModule.from_expr(func))
    assert builds, "exp is not covered, so TVM must have evaluated it"
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])


def test_prefold_leaves_shape_of_graphs_to_tvm() -> None:
    x = relay.var("x", shape=(2, 3))
    body = relay.add(relay.shape_of(x), _const(np.array([1, 1], "int32")))
    func = relay.Function(
        [x],
        relay.multiply(_const(np.float32(2)), _const(np.float32(3)))
        + relay.sum(relay.cast(body, "float32")),
    )
    assert prefold_function(func)[0].same_as(func)


@pytest.mark.parametrize("target", [X86, CUDA])
def test_folded_module_equals_upstream_fold_constant(target: str) -> None:
    """Whole pipeline up to FuseOps, ours vs upstream's pass prefix: the same module.

    With ``link_params`` FuseOps puts the weights inside the fused functions, so every folded
    value is compared here, and our folds compute them all (nothing is deferred).
    """
    mod, params = load("conv_bias_bn_relu")
    tgt = tvm.target.Target(target)
    config = {**DEFAULT_PASS_CONFIG, "relay.FuseOps.link_params": True}
    with extraction_scope(tgt, PassSettings(config=config)):
        ours = optimize(as_module(mod), params)
        bound = relay.build_module.bind_params_by_name(load("conv_bias_bn_relu")[0]["main"], params)
        prefix = tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, True)
        seq = tvm.transform.Sequential([prefix, relay.transform.FuseOps()])
        theirs = seq(tvm.IRModule.from_expr(bound))
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])


def _fold_both(func: relay.Function) -> tuple[tvm.IRModule, tvm.IRModule]:
    """Our fold as the pipeline runs it (deferral allowed, placeholders tracked), TVM's."""
    from relay_tasks.optimize.fold import FoldConstant
    from relay_tasks.optimize.placeholders import deferred_placeholders

    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    with tvm.transform.PassContext(opt_level=3), deferred_placeholders():
        return FoldConstant()(mod), relay.transform.FoldConstant()(mod)


def test_deferred_results_are_computed_when_something_reads_them() -> None:
    w = np.random.default_rng(2).standard_normal((64, 128)).astype("float32")
    chain = relay.transpose(relay.reshape(relay.const(w), (128, 64)))  # both large: deferred
    func = relay.Function([], relay.exp(chain))  # exp is TVM's to fold: it reads the chain
    ours, theirs = _fold_both(func)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])


def test_deferred_results_that_nothing_reads_are_never_computed(monkeypatch) -> None:
    from relay_tasks.optimize import fold

    calls: list[str] = []
    real = evaluate.EVALUATORS["reshape"]
    monkeypatch.setitem(
        evaluate.EVALUATORS, "reshape", lambda a, x: calls.append("r") or real(a, x)
    )
    w = np.random.default_rng(3).standard_normal((64, 128)).astype("float32")
    x = relay.var("x", shape=(128, 64))
    func = relay.Function([x], relay.add(x, relay.reshape(relay.const(w), (128, 64))))
    ours, theirs = _fold_both(func)
    folded, upstream = ours["main"].body.args[1], theirs["main"].body.args[1]
    assert isinstance(folded, relay.Constant)
    assert folded.data.shape == upstream.data.shape and folded.data.dtype == upstream.data.dtype
    assert calls == []  # the fold left the value of a fused function's argument alone
    small = relay.Function([x], relay.add(x, relay.reshape(relay.const(w[:1, :64]), (64,))))
    _fold_both(small)
    assert calls == ["r"]  # small results are computed as usual
    # Outside the pipeline's guard nothing is deferred: a lone FoldConstant computes it all.
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    with tvm.transform.PassContext(opt_level=3):
        fold.FoldConstant()(mod)
    assert calls == ["r", "r"]


def test_placeholders_are_tracked_until_filled_and_the_size_bound_is_inclusive() -> None:
    """Each deferred result is listed as unfilled while the guard is open, and leaves the list
    when something reads it; exactly DEFER_MIN_ELEMENTS elements is large enough to defer."""
    from relay_tasks.optimize.fold import FoldConstant
    from relay_tasks.optimize.placeholders import DEFER_MIN_ELEMENTS, deferred_placeholders

    side = int(DEFER_MIN_ELEMENTS**0.5)
    assert side * side == DEFER_MIN_ELEMENTS
    w = np.random.default_rng(4).standard_normal((side, side)).astype("float32")
    x = relay.var("x", shape=(side, side))
    unread = relay.Function([x], relay.add(x, relay.transpose(relay.const(w))))
    read = relay.Function([], relay.exp(relay.transpose(relay.const(w))))  # TVM folds exp
    for func, left in ((unread, 1), (read, 0)):
        mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
        with tvm.transform.PassContext(opt_level=3), deferred_placeholders() as unfilled:
            FoldConstant()(mod)
            assert [tuple(c.data.shape) for c in unfilled.values()] == [(side, side)] * left
    y = relay.var("y", shape=(side - 1, side))
    smaller = relay.Function([y], relay.add(y, relay.transpose(relay.const(w[:, 1:]))))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(smaller))
    with tvm.transform.PassContext(opt_level=3), deferred_placeholders() as unfilled:
        FoldConstant()(mod)
        assert unfilled == {}


@pytest.mark.parametrize(
    ("values", "reader"),
    [
        # numpy declines NaN: the deferred value is TVM's to compute when exp reads it
        (np.full((64, 64), np.nan, "float32"), lambda c: relay.exp(c)),
        # an int32 placeholder is int32 before it is filled
        (
            np.arange(4096, dtype="int32").reshape(64, 64),
            lambda c: relay.left_shift(c, relay.const(1, "int32")),
        ),
    ],
)
def test_deferred_results_keep_their_type_and_fall_back_to_tvm(values, reader) -> None:
    """Read by an op TVM folds (so the placeholder is filled first), the value is TVM's."""
    func = relay.Function([], reader(relay.transpose(relay.const(values))))
    ours, theirs = _fold_both(func)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])


@pytest.mark.parametrize("primitive", [1, 0])
def test_primitive_functions_are_folded_only_as_fold_constant_folds_them(primitive: int) -> None:
    """FoldConstant leaves the inside of a primitive (fused) function alone."""
    x = relay.var("x", shape=(2,))
    one = _const(np.ones(2, "float32"))
    inner = relay.Function([x], relay.add(x, relay.add(one, one))).with_attr("Primitive", primitive)
    y = relay.var("y", shape=(2,))
    func = relay.Function([y], relay.Call(inner, [y]))
    ours, theirs = _fold_both(func)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])
    assert prefold_function(func)[0].same_as(func) == bool(primitive)


def test_bool_constants_are_read_as_bools() -> None:
    """DLPack does not carry bool here: such constants are read through a copy."""
    condition = np.array([[True], [False], [True]])
    x, y = np.ones((3, 4), "float32"), np.zeros((1, 4), "float32")
    func = relay.Function([], relay.where(_const(condition), _const(x), _const(y)))
    ours, theirs = _fold_both(func)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])
    assert isinstance(prefold_function(func)[0].body, relay.Constant)


@pytest.mark.parametrize(
    "value",
    [
        np.array([True, False]),
        np.zeros((0, 3), "float32"),
        np.arange(12, dtype="float32").reshape(3, 4).T,  # not contiguous
        np.arange(13, dtype="float32")[1:],  # not aligned
        np.float32(7).reshape(()),
    ],
    ids=["bool", "empty", "strided", "unaligned", "scalar"],
)
def test_every_kind_of_array_becomes_an_equal_ndarray(value: np.ndarray) -> None:
    from relay_tasks.optimize.evaluate import as_ndarray

    converted = as_ndarray(value)
    assert converted.dtype == str(value.dtype) and converted.shape == value.shape
    np.testing.assert_array_equal(converted.numpy(), value)


@settings(max_examples=60, deadline=None)
@given(
    shape=hnp.array_shapes(min_dims=2, max_dims=4, min_side=1, max_side=70),
    data=st.data(),
)
def test_tiled_transposes_copy_every_element(shape: tuple[int, ...], data: st.DataObject) -> None:
    """Transposed weights are copied in tiles when large: every permutation of every shape
    gives numpy's own contiguous copy, aligned so it becomes a constant without a copy."""
    from relay_tasks.optimize.evaluate import contiguous

    x = np.arange(int(np.prod(shape)), dtype="float32").reshape(shape)
    axes = data.draw(st.permutations(range(len(shape))))
    copy = contiguous(np.transpose(x, axes))
    assert copy.flags.c_contiguous and copy.ctypes.data % 64 == 0
    assert np.array_equal(copy, np.ascontiguousarray(np.transpose(x, axes)))


def test_a_large_transpose_is_tiled_and_exact() -> None:
    from relay_tasks.optimize.evaluate import contiguous

    w = np.random.default_rng(4).standard_normal((300, 130)).astype("float32")
    assert np.array_equal(contiguous(w.T), w.T)
    assert np.array_equal(
        contiguous(w.reshape(3, 100, 130).transpose(2, 0, 1)),
        w.reshape(3, 100, 130).transpose(2, 0, 1),
    )


def test_reshaped_and_broadcast_weights_fold_as_tvm_folds_them() -> None:
    """PyTorch's linear layers reach the fold as reshape(broadcast_to(transpose(W))): the
    reshaped and broadcast results share the transposed weight's buffer instead of copying it.
    The module must equal TVM's fold, and each constant keep its own value when another
    constant of the chain is read or dropped."""
    import gc

    w = np.random.default_rng(5).standard_normal((96, 80)).astype("float32")
    x = relay.var("x", shape=(1, 4, 80))
    weight = relay.reshape(
        relay.broadcast_to(relay.transpose(relay.const(w)), (1, 80, 96)), (1, 80, 96)
    )
    tiled = relay.reshape(
        relay.broadcast_to(relay.transpose(relay.const(w)), (2, 80, 96)), (2, 80, 96)
    )
    func = relay.Function(
        [x], relay.Tuple([relay.nn.batch_matmul(x, weight, transpose_b=False), tiled])
    )
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    ours = relay.transform.InferType()(tvm.IRModule.from_expr(prefold_function(mod["main"])[0]))
    theirs = relay.transform.FoldConstant()(mod)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])
    constants = [ours["main"].body.fields[0].args[1], ours["main"].body.fields[1]]
    del ours, mod, func
    gc.collect()
    assert np.array_equal(constants[0].data.numpy()[0], w.T)
    assert np.array_equal(constants[1].data.numpy()[1], w.T)


def test_reshapes_and_unit_broadcasts_of_a_folded_constant_share_its_buffer() -> None:
    """The operand's bytes under another shape become a view of its array, not a copy (72
    weight matrices of BERT-base from PyTorch: 650 MB of copies otherwise)."""
    from relay_tasks.optimize.placeholders import buffer_address

    w = np.random.default_rng(6).standard_normal((64, 96)).astype("float32")
    t = relay.transpose(relay.const(w))
    outputs = [t, relay.reshape(t, (96 * 64,)), relay.broadcast_to(t, (1, 96, 64))]
    func = relay.Function([], relay.Tuple(outputs))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    folded, _ = prefold_function(mod["main"])
    assert tvm.ir.structural_equal(folded, relay.transform.FoldConstant()(mod)["main"])
    assert len({buffer_address(field.data) for field in folded.body.fields}) == 1


def test_fresh_results_become_constants_without_a_copy_and_views_are_copied() -> None:
    from relay_tasks.optimize.evaluate import aligned_empty, as_ndarray

    fresh = aligned_empty((64, 64), "float32")
    fresh[...] = 1.5
    shared = as_ndarray(fresh)
    fresh[0, 0] = 7.0  # the constant is this very buffer
    assert shared.numpy()[0, 0] == 7.0
    view = np.broadcast_to(np.float32(2.0), (8, 8))  # read-only: copied
    copied = as_ndarray(view)
    assert np.array_equal(copied.numpy(), view)
    unaligned = np.zeros(65, "float32")[1:]
    assert np.array_equal(as_ndarray(unaligned).numpy(), unaligned)


@pytest.mark.parametrize(
    ("config", "executor", "linked"),
    [
        (None, None, False),
        (None, {}, False),
        (None, {"link-params": False}, False),
        (None, {"link-params": True}, True),
        (True, None, True),
        (False, {"link-params": True}, False),  # the pass config wins, as in FuseOps
        (True, {"link-params": False}, True),
    ],
)
def test_links_params_decides_as_fuse_ops_does(config: Any, executor: Any, linked: bool) -> None:
    from relay_tasks.optimize.fold import links_params

    mod = tvm.IRModule.from_expr(relay.Function([], relay.const(1.0)))
    if executor is not None:
        mod = mod.with_attr("executor", relay.backend.Executor("graph", executor))
    options = {} if config is None else {"relay.FuseOps.link_params": config}
    assert links_params(mod, tvm.transform.PassContext(config=options)) is linked


def test_an_unfilled_placeholder_inside_a_fused_function_is_named() -> None:
    from relay_tasks.errors import ExtractionError
    from relay_tasks.optimize.placeholders import refuse_placeholders

    placeholder = relay.Constant(tvm.nd.empty((8,), "float32"))
    other = relay.Constant(tvm.nd.array(np.ones(8, "float32")))
    x = relay.var("x", shape=(8,))
    fused = relay.Function([x], relay.add(relay.add(x, other), placeholder))
    fused = fused.with_attr("Primitive", 1).with_attr("hash", "00c0ffee")
    y = relay.var("y", shape=(8,))
    outside = relay.add(relay.Call(fused, [y]), placeholder)  # outside a fused function: fine
    mod = tvm.IRModule.from_expr(relay.Function([y], outside))
    refuse_placeholders(mod, {})
    lookalike = relay.Constant(tvm.nd.empty((8,), "float32"))  # same type, another buffer
    refuse_placeholders(mod, {lookalike.handle.value: lookalike})
    rebuilt = relay.Function([x], relay.add(x, relay.Constant(placeholder.data)))  # as FuseOps does
    rebuilt = rebuilt.with_attr("Primitive", 1).with_attr("hash", "0ddba11")
    with pytest.raises(ExtractionError, match="inside 0ddba11;"):
        refuse_placeholders(
            tvm.IRModule.from_expr(relay.Function([y], relay.Call(rebuilt, [y]))),
            {placeholder.handle.value: placeholder},
        )
    plain = tvm.IRModule.from_expr(relay.Function([y], outside.args[1] + y))
    refuse_placeholders(plain, {placeholder.handle.value: placeholder})
    with pytest.raises(ExtractionError) as caught:
        refuse_placeholders(mod, {placeholder.handle.value: placeholder})
    assert str(caught.value) == (
        "a constant whose value was deferred and never computed is inside 00c0ffee; relay-tasks "
        "would lower an uninitialised buffer (please report this model)"
    )
    unnamed = tvm.IRModule.from_expr(
        relay.Function([y], relay.Call(fused.without_attr("hash"), [y]))
    )
    with pytest.raises(ExtractionError, match="is inside a function;"):
        refuse_placeholders(unnamed, {placeholder.handle.value: placeholder})


def _scaled_conv(scale: relay.Expr) -> tvm.IRModule:
    """conv2d (4096 channels) -> relu -> multiply by ``scale``: BackwardFoldScaleAxis folds the
    scale into the weight only if it reads every element as positive (relu comes between)."""
    x = relay.var("x", shape=(1, 4, 2, 2))
    weight = relay.const(np.full((4096, 4, 1, 1), 0.5, "float32"))
    conv = relay.nn.relu(relay.nn.conv2d(x, weight, kernel_size=(1, 1), channels=4096))
    return tvm.IRModule.from_expr(relay.Function([x], relay.multiply(conv, scale)))


def test_a_deferred_scale_is_computed_before_fold_scale_axis_reads_its_sign() -> None:
    """The scale is a fold result large enough to be deferred; the scale pass reads it in C++."""
    positive = relay.const(np.linspace(1, 2, 4096, dtype="float32"))
    mod = _scaled_conv(relay.reshape(positive, (4096, 1, 1)))
    tasks = assert_meta_schedule_matches(mod, {}, X86)
    assert not any("multiply" in t.task_name for t in tasks)  # the scale was folded away


def test_a_deferred_constant_is_computed_before_tvm_simplifies_a_cut_holding_it() -> None:
    """``(x * c1) * c2`` with c1 deferred: TVM's rewrite folds ``c1 * c2`` with its evaluator."""
    x = relay.var("x", shape=(64, 64))
    c1 = relay.transpose(relay.const(np.linspace(1, 2, 4096, dtype="float32").reshape(64, 64)))
    c2 = relay.const(np.float32(3))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.exp(x * c1 * c2)))
    left, (ours, theirs) = _prefix_and_ours(mod)
    assert tvm.ir.structural_equal(ours, theirs)
    assert left == {}  # c1 was read, so computed


def _prefix_and_ours(mod: tvm.IRModule) -> tuple[Any, tuple[tvm.IRModule, tvm.IRModule]]:
    """Our pipeline (deferral on) and upstream's prefix + FuseOps, with every constant still
    outside a fused function computed in ours (as something would compute it on reading)."""
    from relay_tasks.optimize.placeholders import deferred_placeholders, fill_all

    with (
        extraction_scope(tvm.target.Target(X86), PassSettings(config=dict(DEFAULT_PASS_CONFIG))),
        deferred_placeholders() as unfilled,
    ):
        ours = optimize(as_module(mod), {})
        left = dict(unfilled)
        fill_all()
    prefix = tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, True)
    with tvm.target.Target(X86), tvm.transform.PassContext(3, config=dict(DEFAULT_PASS_CONFIG)):
        theirs = tvm.transform.Sequential([prefix, relay.transform.FuseOps()])(mod)
    return left, (ours, theirs)


def test_python_hooks_read_deferred_weights_computed(monkeypatch) -> None:
    """A layout hook that reads the weight it is given sees the folded values."""
    seen: list[np.ndarray] = []

    def hook(attrs: Any, inputs: Any, tinfos: Any, out_type: Any) -> None:
        if isinstance(inputs[1], relay.Constant):
            seen.append(inputs[1].data.numpy())

    from tvm import topi

    monkeypatch.setattr(topi.nn, "dense_alter_layout", hook)
    values = np.linspace(-1, 1, 64 * 128, dtype="float32").reshape(128, 64)
    x = relay.var("x", shape=(2, 64))
    weight = relay.transpose(relay.const(values.T.copy()))  # large: deferred by the first fold
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, weight)))
    with extraction_scope(tvm.target.Target(X86), PassSettings(config=dict(DEFAULT_PASS_CONFIG))):
        optimize(as_module(mod), {})
    assert seen and all(np.array_equal(s, values) for s in seen)


def test_the_read_hook_is_installed_while_any_extraction_needs_it() -> None:
    from relay_tasks.optimize.placeholders import filled_on_read

    assert "data" not in vars(relay.Constant)
    with filled_on_read():
        with filled_on_read():  # another thread's extraction, say
            assert "data" in vars(relay.Constant)
        assert "data" in vars(relay.Constant)
        assert relay.const(np.ones(2, "float32")).data.numpy().tolist() == [1, 1]
    assert "data" not in vars(relay.Constant)
