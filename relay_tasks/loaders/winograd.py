"""3x3 stride-1 convolutions as Winograd convolutions, F(4x4, 3x3), in NHWC.

TOPI's NCHWc schedules already run ResNet-18's 3x3 convolutions at this CPU's FMA limit (its
untuned build took 17.7 ms, ONNX Runtime 17.4), so no schedule of the same arithmetic makes it
faster; fewer multiplies can. Winograd's F(4x4, 3x3) makes each 4x4 output tile of a channel
pair from 36 products instead of 144, plus transforms of the input and output tiles. A
10-minute MetaSchedule tune ran ResNet-18's 128-channel convolution that way in 0.46 ms,
against 1.14 ms for the direct one.

TVM's x86 strategy offers Winograd to MetaSchedule and Ansor only, only in NHWC, and only for
64 < output channels < 512 (from a profile of ResNet on Skylake), which leaves out the first
stage of a ResNet, 4.8 of ResNet-18's 17.7 ms. Here every 3x3 stride-1 convolution by a known
float32 kernel is converted to NHWC (``ConvertLayout``; the others stay as they are, so layout
conversions fall only where the two kinds meet) and calls TVM's
``contrib_conv2d_winograd_without_weight_transform`` with its kernel transformed here, once, in
numpy. TOPI schedules that operator for MetaSchedule and Ansor only, and the tasks differ from
the model's own: tune and compile a model alike, with one of those tuners. A convolution
whose large transformed kernel few output tiles share stays direct (:func:`_worth_it`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import relay
from tvm.ir import IRModule
from tvm.relay.build_module import bind_params_by_name
from tvm.relay.dataflow_pattern import DFPatternCallback, is_op, rewrite, wildcard
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

from ..adapters.untuned import WINOGRAD, Signature, signature
from ..ir import native_warnings_muted, static_shape
from ..optimize.fold import constant_limit

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from ..adapters.base import TunerTask
    from .frontend import Params

#: The tuners TVM's CPU strategy gives Winograd convolutions a schedule for.
TUNERS = ("meta_schedule", "ansor")

#: Output tile edge: F(4x4, 3x3), TVM's choice for x86, on 6x6 input tiles.
TILE = 4

#: Fewest output tiles a convolution whose transformed kernel streams from memory needs to
#: stay Winograd. Each of the kernel's (TILE + 2)^2 x in x out weights is used once a tile,
#: against once an output pixel for the direct kernel (16 times as often): at ResNet's 7x7
#: stage, 4 tiles, the multiplies wait on the 38 MB kernel, and the direct convolution runs
#: from a quarter of those bytes. At its 14x14 stage (16 tiles of a 9.4 MB kernel) the model
#: ran as fast with those convolutions direct (TOPI's default), and their Winograd candidates
#: had taken a third to half of a tune's Winograd trials, 2-5 s each to build.
MIN_TILES = 32

#: Bytes of transformed kernel that stay cached from one call to the next, whatever the tiles.
CACHED_BYTES = 4 << 20

#: Kernel layout by data layout, and where the kernel's and the data's height and width are.
_LAYOUTS = {
    "NCHW": ("OIHW", slice(2, 4), slice(2, 4)),
    "NHWC": ("HWIO", slice(0, 2), slice(1, 3)),
}


def winograd_tasks(tasks: Sequence[TunerTask]) -> bool:
    """Whether any of ``tasks`` computes a Winograd convolution (TVM names a primitive function
    after its operators)."""
    return any("conv2d_winograd" in task.name for task in tasks)


def _filter_transform() -> np.ndarray[Any, Any]:
    """G of F(TILE x TILE, 3x3) (6x3), from TVM's own interpolation points, so that the kernel
    transformed here is the one TOPI's input and output transforms expect."""
    _, _, g = _cook_toom_convolution(_interpolation_points(TILE + 1), TILE, 3)
    return np.asarray(g, dtype=np.float64)


def _fits(call: relay.Call, kernel: Any) -> bool:
    """Whether a typed ``nn.conv2d`` is a 3x3, stride-1, undilated, ungrouped float32
    convolution in NCHW or NHWC whose kernel (``kernel``, its value if known) is known."""
    attrs = call.attrs
    layout = _LAYOUTS.get(str(attrs.data_layout))
    if layout is None or str(attrs.kernel_layout) != layout[0]:
        return False
    if str(attrs.out_layout) not in ("", str(attrs.data_layout)):
        return False
    data, weight = (arg.checked_type for arg in call.args)
    return (
        kernel is not None
        and static_shape(data.shape)
        and [int(d) for d in weight.shape[layout[1]]] == [3, 3]
        and _padded_enough([int(d) for d in data.shape[layout[2]]], _padding(attrs))
        and [int(s) for s in attrs.strides] == [1, 1]
        and [int(d) for d in attrs.dilation] == [1, 1]
        and int(attrs.groups) == 1
        and data.dtype == weight.dtype == "float32"
        and str(attrs.out_dtype) in ("", "float32")
        and _transformed(weight.shape) * 8 <= constant_limit()
        and _worth_it([int(d) for d in call.checked_type.shape[layout[2]]], weight.shape)
    )


def _transformed(kernel_shape: Any) -> int:
    """Weights of a 3x3 kernel transformed: (TILE + 2)^2 taps for its 9. Transformed in
    float64, 8 bytes each: no more than a fold may make a constant (a model whose kernel folds
    to just under that limit is a small file)."""
    return (TILE + 2) ** 2 * math.prod(int(d) for d in kernel_shape) // 9


def _worth_it(output: list[int], kernel_shape: Any) -> bool:
    """Whether the multiplies Winograd saves outweigh reading its kernel, 4 times the direct
    one's: enough output tiles (:data:`MIN_TILES`) use each weight, or the kernel (float32)
    is small enough to stay cached."""
    tiles = math.prod(-(-n // TILE) for n in output)
    return tiles >= MIN_TILES or _transformed(kernel_shape) * 4 <= CACHED_BYTES


def _padding(attrs: Any) -> list[int]:
    """A convolution's padding as top, left, bottom, right."""
    given = [int(p) for p in attrs.padding]
    return given * 2 if len(given) == 2 else given


def _padded_enough(sizes: list[int], padding: list[int]) -> bool:
    """Whether TOPI's NHWC Winograd pads the data far enough for every tile it reads. It pads
    the bottom and the right alike, by what the tiles across (not down) need beyond the output
    height and the padding: where the tiles down need more, or the width does, tiles read past
    the data (a 9x7 input: rows 7 and 8 came out as 1e37)."""
    (height, width), (top, left, bottom, right) = sizes, padding
    rows, cols = height + top + bottom, width + left + right
    down, across = (-(-(n - 2) // TILE) for n in (rows, cols))
    extra = (across - 1) * TILE + TILE + 2 - (rows - 2 + top + bottom)
    return extra >= 0 and all(n + extra >= (t - 1) * TILE + TILE + 2
                              for n, t in ((rows, down), (cols, across)))  # fmt: skip


def _known_kernel(weight: relay.Expr, params: Params) -> Any:
    """The kernel's value where the model gives it (a constant, or a param), else None."""
    if isinstance(weight, relay.Constant):
        return weight.data
    if isinstance(weight, relay.Var) and weight.name_hint in params:
        return params[weight.name_hint]
    return None


def _hwio(weight: relay.Expr) -> np.ndarray[Any, Any] | None:
    """An NHWC convolution's kernel as an HWIO array: a constant, or ``ConvertLayout``'s
    transform of an OIHW one; None for anything else."""
    if isinstance(weight, relay.Constant):
        return np.asarray(weight.data.numpy())
    transformed = (
        isinstance(weight, relay.Call)
        and getattr(weight.op, "name", "") == "layout_transform"
        and isinstance(weight.args[0], relay.Constant)
        and (str(weight.attrs.src_layout), str(weight.attrs.dst_layout)) == ("OIHW", "HWIO")
    )
    if transformed:
        return np.asarray(weight.args[0].data.numpy()).transpose(2, 3, 1, 0)
    return None


class _Winograd(DFPatternCallback):  # type: ignore[misc]
    """An NHWC convolution that :func:`_fits`, as a Winograd convolution by its transformed
    kernel (alpha x alpha x out x in, alpha = TILE + 2)."""

    def __init__(self) -> None:
        super().__init__(require_type=True)
        self.data = wildcard()
        self.weight = wildcard()
        self.pattern = is_op("nn.conv2d")(self.data, self.weight)
        self.g = _filter_transform()

    def callback(self, pre: Any, post: Any, node_map: Any) -> Any:
        kernel = _hwio(node_map[self.weight][0])
        if str(pre.attrs.data_layout) != "NHWC" or not _fits(pre, kernel):
            return post
        assert kernel is not None
        transformed = np.einsum("ek,klio,nl->enoi", self.g, kernel.astype(np.float64), self.g)
        attrs = pre.attrs
        return relay.nn.contrib_conv2d_winograd_without_weight_transform(
            node_map[self.data][0],
            relay.const(transformed.astype("float32")),
            TILE,
            padding=attrs.padding,
            channels=kernel.shape[3],
            kernel_size=(3, 3),
            data_layout="NHWC",
            kernel_layout="HWIO",
            out_dtype="float32",
        )


class _Sized(DFPatternCallback):  # type: ignore[misc]
    """An ``nn.conv2d`` with its ``channels`` and ``kernel_size`` given, from its kernel's
    type: ``ConvertLayout`` refuses a convolution without them, and where a frontend sets
    them, a Relay graph built by hand need not."""

    def __init__(self) -> None:
        super().__init__(require_type=True)
        self.pattern = is_op("nn.conv2d")(wildcard(), wildcard())

    def callback(self, pre: Any, post: Any, node_map: Any) -> Any:
        attrs = pre.attrs
        if attrs.channels is not None and attrs.kernel_size is not None:
            return post
        layout = str(attrs.kernel_layout)
        shape = [int(d) for d in pre.args[1].checked_type.shape]
        return relay.nn.conv2d(
            *post.args,
            strides=attrs.strides,
            padding=attrs.padding,
            dilation=attrs.dilation,
            groups=attrs.groups,
            channels=shape[layout.index("O")],
            kernel_size=(shape[layout.index("H")], shape[layout.index("W")]),
            data_layout=attrs.data_layout,
            kernel_layout=layout,
            out_layout=attrs.out_layout,
            out_dtype=attrs.out_dtype,
        )


def _calls_of(main: relay.Function, op: str) -> list[relay.Call]:
    """``main``'s calls of ``op`` in post order, the order ``ConvertLayout`` asks
    ``LayoutConfig`` whether to skip a convolution."""
    calls: list[relay.Call] = []

    def visit(node: Any) -> None:
        if isinstance(node, relay.Call) and getattr(node.op, "name", None) == op:
            calls.append(node)

    relay.analysis.post_order_visit(main, visit)
    return calls


def winograd_convolutions(
    mod: IRModule, params: Params, *, direct: Collection[Signature] = ()
) -> tuple[IRModule, Params]:
    """``mod`` with each 3x3 stride-1 float32 convolution by a known kernel as an NHWC Winograd
    convolution, and ``params`` without the kernels it took in. The others, and a module
    without any such convolution, are left as they are; so are those whose Winograd call
    would have a signature in ``direct`` (:func:`..adapters.untuned.signature`: what a build
    found no right record for)."""
    typed = relay.transform.InferType()(mod)
    convolutions = _calls_of(typed["main"], "nn.conv2d")
    kernels = [_known_kernel(call.args[1], params) for call in convolutions]
    chosen = [_fits(call, kernel) for call, kernel in zip(convolutions, kernels, strict=True)]
    if not any(chosen):
        return mod, params
    bound = {
        call.args[1].name_hint
        for call, fits in zip(convolutions, chosen, strict=True)
        if fits and isinstance(call.args[1], relay.Var)
    }
    if bound:
        typed["main"] = bind_params_by_name(typed["main"], {n: params[n] for n in bound})
        params = {name: value for name, value in params.items() if name not in bound}
    typed["main"] = rewrite(_Sized(), typed["main"])
    converted = _converted(typed, chosen)
    if direct:
        # Winograd calls come in the order of the convolutions they replace.
        calls = iter(_calls_of(converted["main"], WINOGRAD))
        chosen = [fits and signature(next(calls)) not in direct for fits in chosen]
        converted = _converted(typed, chosen)
    return converted, params


def _converted(typed: IRModule, chosen: list[bool]) -> IRModule:
    """``typed`` with the ``chosen`` convolutions (in post order) as Winograd ones."""
    if not any(chosen):
        return typed
    skipped = [index for index, fits in enumerate(chosen) if not fits]
    convert = tvm.transform.Sequential(
        [
            relay.transform.InferType(),
            relay.transform.ConvertLayout({"nn.conv2d": ["NHWC", "HWIO"]}),
        ]
    )
    with (
        tvm.transform.PassContext(opt_level=3),
        relay.transform.LayoutConfig(skip_layers=skipped),
        native_warnings_muted(),
    ):
        converted = convert(typed)
    converted["main"] = rewrite(_Winograd(), converted["main"])
    return relay.transform.InferType()(converted)
