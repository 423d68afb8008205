"""The evaluator table: each covered op computed by numpy bit for bit as TVM's FoldConstant does.

Property tests build random constant calls of every covered op and compare our value with what
TVM's own ``FoldConstantExpr`` computes (an LLVM build per example, hence the modest default
budget; set ``RELAY_TASKS_FOLD_EXAMPLES`` for more).
"""

from __future__ import annotations

import operator
import os

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tvm import relay

from relay_tasks.optimize import evaluate
from relay_tasks.optimize.evaluate import EVALUATORS, evaluate_call, layout_transform

from checks import constant

EXAMPLES = int(os.environ.get("RELAY_TASKS_FOLD_EXAMPLES", "20"))
FOLD = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_tvm_fold = tvm.get_global_func("relay._transform.FoldConstantExpr")


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
    assert _check(relay.divide(constant(a), constant(b)), [a, b]) is not None


@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "minimum", "maximum"])
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
    call = getattr(relay, op)(constant(a), constant(b))
    assert _check(call, [a, b]) is not None


@pytest.mark.parametrize("op", ["negative", "sqrt", "rsqrt", "abs"])  # each op its own budget
@FOLD
@given(dtype=st.sampled_from(["float32", "float64"]), shape=shapes, data=st.data())
def test_unary_arithmetic_is_bit_exact(op, dtype, shape, data) -> None:
    x = data.draw(_floats(dtype, shape))
    call = getattr(relay, op)(constant(x))
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
    call = getattr(relay, op)(constant(a), constant(a))
    assert evaluate_call(call, [a, a], relay.transform.InferTypeLocal(call)) is None


def _integers(dtype: str, shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    info = np.iinfo(dtype)
    edges = [info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max]
    small = st.integers(max(info.min, -1000), min(info.max, 1000))
    elements = st.one_of(small, st.sampled_from([e for e in edges if e >= info.min]))
    return hnp.arrays(dtype, shape, elements=elements)


#: Two broadcastable arrays of one integer dtype, edge values included (see ``_integers``).
INTEGER_PAIRS = given(
    dtype=st.sampled_from(["int32", "int64"]),
    shape_pair=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4),
    data=st.data(),
)


@pytest.mark.parametrize("op", ["add", "subtract"])
@FOLD
@INTEGER_PAIRS
def test_integer_sums_are_exact_or_left_to_tvm(op, dtype, shape_pair, data) -> None:
    """Integer add and subtract are folded here unless an element overflows, which LLVM's
    no-signed-wrap arithmetic leaves undefined: those go to TVM whatever it makes of them."""
    a_shape, b_shape = shape_pair.input_shapes
    a, b = data.draw(_integers(dtype, a_shape)), data.draw(_integers(dtype, b_shape))
    exact = np.asarray(getattr(operator, op[:3])(a.astype(object), b.astype(object)))
    info = np.iinfo(dtype)
    overflows = bool(np.any((exact < info.min) | (exact > info.max)))
    call = getattr(relay, op)(constant(a), constant(b))
    ours = evaluate_call(call, [a, b], relay.transform.InferTypeLocal(call))
    assert (ours is None) == overflows
    if ours is not None:
        _assert_same_bits(ours, _tvm_value(call))
        assert np.array_equal(ours, exact.astype(dtype))


@pytest.mark.parametrize("op", ["floor_divide", "floor_mod"])
@FOLD
@INTEGER_PAIRS
def test_integer_floor_division_is_exact_and_undefined_quotients_are_left_to_tvm(
    op, dtype, shape_pair, data
) -> None:
    """Floored quotients and remainders of integers, negative operands included; a zero divisor
    or the least value over -1 (no defined value in LLVM's code) goes to TVM."""
    a_shape, b_shape = shape_pair.input_shapes
    a, b = data.draw(_integers(dtype, a_shape)), data.draw(_integers(dtype, b_shape))
    a_wide, b_wide = np.broadcast_arrays(a.astype(object), b.astype(object))
    undefined = any(
        y == 0 or (x == np.iinfo(dtype).min and y == -1)
        for x, y in zip(a_wide.flat, b_wide.flat, strict=True)
    )
    call = getattr(relay, op)(constant(a), constant(b))
    ours = evaluate_call(call, [a, b], relay.transform.InferTypeLocal(call))
    assert (ours is None) == undefined
    if ours is not None:
        _assert_same_bits(ours, _tvm_value(call))
        exact = (a_wide // b_wide) if op == "floor_divide" else (a_wide % b_wide)
        assert np.array_equal(ours, np.asarray(exact).astype(dtype))


def test_float_floor_division_goes_to_tvm() -> None:
    a, b = np.array([7.5, -7.5], "float32"), np.array([2.0, 2.0], "float32")
    call = relay.floor_divide(constant(a), constant(b))
    assert evaluate_call(call, [a, b], relay.transform.InferTypeLocal(call)) is None


@pytest.mark.parametrize("op", ["minimum", "maximum", "abs"])
@FOLD
@INTEGER_PAIRS
def test_integer_selects_are_exact_and_abs_of_the_least_value_is_left_to_tvm(
    op, dtype, shape_pair, data
) -> None:
    """TIR's min and max select an operand; integer abs negates, and the negation of the most
    negative value has no defined result in LLVM's code: that one goes to TVM."""
    a_shape, b_shape = shape_pair.input_shapes
    a, b = data.draw(_integers(dtype, a_shape)), data.draw(_integers(dtype, b_shape))
    if op == "abs":
        call, args = relay.abs(constant(a)), [a]
        undefined = bool(a.size) and a.min() == np.iinfo(dtype).min
    else:
        call, args = getattr(relay, op)(constant(a), constant(b)), [a, b]
        undefined = False
    ours = evaluate_call(call, args, relay.transform.InferTypeLocal(call))
    assert (ours is None) == undefined
    if ours is not None:
        _assert_same_bits(ours, _tvm_value(call))


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
    c, wide, indices = constant(x), x[None], np.array([1, 0, 1], "int32")
    return {
        "expand_dims": (relay.expand_dims(c, 1), [x]),
        "squeeze": (relay.squeeze(constant(wide), [0]), [wide]),
        "transpose": (relay.transpose(c, [2, 0, 1]), [x]),
        "reshape": (relay.reshape(c, (4, -1)), [x]),
        "copy": (relay.copy(c), [x]),
        "nn.batch_flatten": (relay.nn.batch_flatten(c), [x]),
        "broadcast_to": (relay.broadcast_to(c, (2, 2, 3, 4)), [x]),
        "strided_slice": (relay.strided_slice(c, [0, 1, 0], [2, 3, 4], [1, 1, 2]), [x]),
        "repeat": (relay.repeat(c, 2, 1), [x]),
        "take": (relay.take(c, constant(indices), axis=2), [x, indices]),
        "concatenate": (relay.concatenate([c, c], 0), [x, x]),
        "layout_transform": (relay.layout_transform(c, "CHW", "CHW2c"), [x]),
        "trilu": (relay.trilu(c, constant(np.int32(1)), upper=False), [x, np.int32(1)]),
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
    call = relay.add(constant(a), constant(a))
    assert evaluate_call(call, [a, a], relay.transform.InferTypeLocal(call)) is None


@FOLD
@given(x=_floats("float32", (2, 1, 3, 1)), axis=st.integers(-5, 4), count=st.integers(1, 2))
def test_expand_dims(x, axis, count) -> None:
    assert _check(relay.expand_dims(constant(x), axis, count), [x]) is not None


@FOLD
@given(x=_floats("float32", (1, 3, 1, 2)), axis=st.sampled_from([None, [0], [2], [0, 2], [-2]]))
def test_squeeze(x, axis) -> None:
    assert _check(relay.squeeze(constant(x), axis), [x]) is not None


@FOLD
@given(
    x=_floats("float32", (2, 3, 4)), axes=st.sampled_from([None, [1, 0, 2], [2, 0, 1], [0, -1, 1]])
)
def test_transpose(x, axes) -> None:
    assert _check(relay.transpose(constant(x), axes), [x]) is not None


@FOLD
@given(
    x=_floats("float32", (2, 3, 4)),
    newshape=st.sampled_from([(24,), (-1,), (0, -1), (4, 0, -1), (-3, 4), (2, -4, 1, 3, 4), (-2,)]),
)
def test_reshape_with_special_codes(x, newshape) -> None:
    assert _check(relay.reshape(constant(x), newshape), [x]) is not None


@FOLD
@given(
    parts=st.lists(_floats("float32", (2, 3)), min_size=1, max_size=3),
    axis=st.sampled_from([0, 1, -1]),
)
def test_concatenate(parts, axis) -> None:
    call = relay.concatenate([constant(p) for p in parts], axis)
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
    call = relay.nn.pad(constant(x), widths, constant(np.float32(value)))
    assert _check(call, [x, np.asarray(value, "float32")]) is not None


@FOLD
@given(
    src=st.sampled_from(["float16", "float32", "float64"]),
    dst=st.sampled_from(["float16", "float32", "float64"]),
    data=st.data(),
)
def test_float_casts(src, dst, data) -> None:
    x = data.draw(hnp.arrays(src, (3, 4), elements=st.floats(-65504, 65504, width=16)))
    ours = _check(relay.cast(constant(x), dst), [x])
    assert (ours is None) == ((src, dst) == ("float64", "float16"))


@FOLD
@given(
    src=st.sampled_from(["float32", "float64"]),
    dst=st.sampled_from(["int8", "int32", "int64", "uint8"]),
    data=st.data(),
)
def test_float_to_integer_casts_truncate_where_defined(src, dst, data) -> None:
    """In range, a float truncates toward zero in LLVM as in numpy; a value outside the
    integer's range (or infinite) has no defined conversion, and the call goes to TVM."""
    info = np.iinfo(dst)
    edges = st.sampled_from([info.min - 1.0, info.min - 0.5, info.max + 0.5, info.max + 1.0])
    inside = st.floats(float(info.min), float(info.max))
    elements = st.one_of(inside, edges, st.just(np.inf), st.just(-np.inf))
    x = data.draw(hnp.arrays("float64", (3, 4), elements=elements)).astype(src)
    ours = _check(relay.cast(constant(x), dst), [x])
    truncated = np.trunc(x.astype("float64"))
    defined = bool(np.all(np.isfinite(x) & (truncated >= info.min) & (truncated <= info.max)))
    assert (ours is not None) == defined


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
    call = relay.layout_transform(constant(x), src, dst)
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
    call = relay.nn.contrib_conv2d_winograd_weight_transform(constant(w), tile)
    typed = relay.transform.InferTypeLocal(call)
    if folded:
        assert _check(call, [w]) is not None
    else:
        assert evaluate_call(call, [w], typed) is None
        with pytest.raises(Exception, match="(?i)support|interpolation|points|tile"):
            _tvm_value(call)
    square = np.zeros((2, 2, 3, 5), "float32")
    sq_call = relay.nn.contrib_conv2d_winograd_weight_transform(constant(square), 2)
    assert evaluate_call(sq_call, [square], relay.transform.InferTypeLocal(sq_call)) is None


@pytest.mark.parametrize(("tile", "kernel"), [(2, 3), (4, 3), (6, 3), (2, 5)])
def test_winograd_weight_transform(tile: int, kernel: int) -> None:
    # (TVM's own evaluation of large tiles with 5x5 kernels takes minutes to compile.)
    rng = np.random.default_rng(tile * 10 + kernel)
    for scale in (1e-3, 1.0, 1e3):
        w = (rng.standard_normal((8, 4, kernel, kernel)) * scale).astype("float32")
        call = relay.nn.contrib_conv2d_winograd_weight_transform(constant(w), tile)
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
    assert _check(relay.cast(constant(x), dst), [x]) is not None


@FOLD
@given(
    data=st.data(), shapes=hnp.mutually_broadcastable_shapes(num_shapes=1, max_dims=4, max_side=4)
)
def test_broadcast_to(data, shapes) -> None:
    (shape,) = shapes.input_shapes
    x = data.draw(_floats("float32", shape))
    call = relay.broadcast_to(constant(x), shapes.result_shape)
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
    call = relay.full(constant(value), shape, dtype or "")
    assert _check(call, [value]) is not None  # every fill here converts exactly


@FOLD
@given(
    fill=st.sampled_from([np.float32(1.5), np.float32(-0.0), np.int64(-7), np.float64(1e300)]),
    data=st.sampled_from([np.zeros((2, 3), "float32"), np.ones((4,), "int64"), np.float64(2)]),
)
def test_full_like(fill, data) -> None:
    """The fill converted to the data's dtype, in its shape; 1e300 has no int64 value: TVM's."""
    value = np.asarray(fill)
    ours = _check(relay.full_like(constant(data), constant(value)), [np.asarray(data), value])
    assert (ours is None) == (value.dtype.kind == "f" and np.asarray(data).dtype.kind == "i"
                              and abs(float(value)) > 2**63)  # fmt: skip


@FOLD
@given(
    x=_floats("float32", (2, 3, 5)),
    k=st.integers(-6, 6),
    upper=st.booleans(),
    k_dtype=st.sampled_from(["int32", "int64"]),
)
def test_trilu(x, k, upper, k_dtype) -> None:
    offset = np.asarray(k, k_dtype)
    assert _check(relay.trilu(constant(x), constant(offset), upper), [x, offset]) is not None


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
    call = relay.strided_slice(constant(x), begin[:rank], end[:rank], strides, axes)
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
    call = relay.strided_slice(constant(x), begin, end, strides, axes)
    assert _check(call, [x]) is not None


@FOLD
@given(x=_floats("float32", (2, 3)), repeats=st.integers(1, 3), axis=st.integers(-2, 1))
def test_repeat(x, repeats, axis) -> None:
    assert _check(relay.repeat(constant(x), repeats, axis), [x]) is not None


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
    call = relay.take(constant(x), constant(indices), axis, mode=mode)
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
        _check(relay.where(constant(condition), constant(x), constant(y)), [condition, x, y])
        is not None
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
    assert _check(getattr(relay, op)(constant(a), constant(b)), [a, b]) is not None


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
    call = relay.arange(*[constant(a) for a in args], dtype=dtype)
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
    ours = _check(relay.arange(*[constant(a) for a in args], dtype=dtype), args)
    exact = dtype == "int64" or (
        float(start).is_integer() and abs(start) + abs(step) * length < 2**24
    )
    assert (ours is not None) == exact


@pytest.mark.parametrize(
    ("value", "dtype", "exact"),
    [
        (np.float32(1e10), "int32", False),  # float to integer: overflow is the target's
        (np.float64(2.5), "int64", True),  # in range: truncated toward zero by both
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
    transpose = relay.transpose(constant(x))
    add = relay.add(constant(x), constant(x))
    monkeypatch.setitem(evaluate.EVALUATORS, "transpose", lambda attrs, args: args[0].copy())
    monkeypatch.setitem(evaluate.EVALUATORS, "add", lambda attrs, args: args[0].astype("float64"))
    for call in (transpose, add):
        assert (
            evaluate_call(call, [x] * len(call.args), relay.transform.InferTypeLocal(call)) is None
        )


def test_take_with_batch_dims_and_pad_with_negative_widths_are_left_to_tvm() -> None:
    x = np.arange(24, dtype="float32").reshape(2, 3, 4)
    indices = np.array([[0, 2], [1, 5]], "int32")
    take = relay.take(constant(x), constant(indices), axis=1, batch_dims=1, mode="clip")
    assert _check(take, [x, indices]) is None
    fill = np.asarray(0, "float32")
    for widths in (((0, 0), (-1, 1), (0, 0)), ((0, 0), (1, -1), (0, 0))):
        assert _check(relay.nn.pad(constant(x), widths), [x, fill]) is None
    assert (
        _check(relay.nn.pad(constant(x), ((0, 0), (1, 1), (0, 2)), 2.5), [x, fill + 2.5])
        is not None
    )


def test_every_evaluator_is_exercised_here() -> None:
    tested = {
        "add",
        "subtract",
        "multiply",
        "divide",
        "floor_divide",
        "floor_mod",
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
        "full_like",
        "trilu",
        "abs",
        "minimum",
        "maximum",
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
    call = relay.copy(constant(x)) if op == "copy" else relay.nn.batch_flatten(constant(x))
    assert _check(call, [x]) is not None


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
