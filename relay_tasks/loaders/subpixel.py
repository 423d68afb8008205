"""A transposed convolution as a convolution of its input and a pixel shuffle.

TOPI's x86 ``conv2d_transpose`` stuffs stride-1 zeros between the input's pixels, pads, and
runs a dense convolution over the result: at stride 2, three of every four multiplies are by a
stuffed zero, and the stuffing is computed inside the convolution's loops. DCGAN's generator
(ONNX, 64x64) took 16.4 ms in TVM that way against ONNX Runtime's 1.5, and the
``conv2d_NCHWc`` that AutoTVM tunes inside those functions is not where the time goes.

Split the kernel by the output pixel's phase modulo the stride instead: every phase is an
ordinary convolution of the unstuffed input with its share of the taps, so one convolution
with ``stride_h * stride_w`` times the output channels computes them all. Interleaving the
phases (a reshape, a transpose and a reshape: ``depth_to_space``'s CRD order) and cropping the
padding gives the same tensor, summed over the same products. The same DCGAN then runs in
1.9 ms untuned, and its tasks are convolutions, which every tuner schedules well.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from tvm import relay
from tvm.ir import IRModule
from tvm.relay.build_module import bind_params_by_name
from tvm.relay.dataflow_pattern import DFPatternCallback, is_constant, is_op, rewrite, wildcard

from ..ir import static_shape
from ..optimize.fold import constant_limit

if TYPE_CHECKING:
    from .frontend import Params


class _Subpixel(DFPatternCallback):  # type: ignore[misc]
    """A 2-D transposed convolution of NCHW data by a constant IOHW kernel, ungrouped and
    undilated (what PyTorch's and ONNX's ``ConvTranspose`` convert to), as its phases'
    convolution; any other form is left as the frontend gave it."""

    def __init__(self) -> None:
        super().__init__(require_type=True)
        self.data = wildcard()
        self.weight = is_constant()
        self.pattern = is_op("nn.conv2d_transpose")(self.data, self.weight)

    def callback(self, pre: Any, post: Any, node_map: Any) -> Any:
        attrs = pre.attrs
        data = node_map[self.data][0]
        plain = (
            int(attrs.groups) == 1
            and [int(d) for d in attrs.dilation] == [1, 1]
            and (attrs.data_layout, attrs.kernel_layout) == ("NCHW", "IOHW")
            and attrs.out_layout in ("", "NCHW")
        )
        in_shape, out_shape = pre.args[0].checked_type.shape, pre.checked_type.shape
        if not plain or not static_shape(in_shape) or not static_shape(out_shape):
            return post
        strides = [int(s) for s in attrs.strides]
        before = [int(p) for p in attrs.padding[:2]]
        sizes = [int(d) for d in in_shape[2:]]
        out = [int(d) for d in out_shape]
        weight = node_map[self.weight][0].data.numpy()
        # A stride past the kernel leaves phases no tap reaches: their kernels would be zeros,
        # as large as the stride squared allows (a crafted 1x1 kernel at stride 1000, a million
        # times its own size), computing nothing.
        if any(s > k for s, k in zip(strides, weight.shape[2:], strict=True)):
            return post
        # Taps per phase along each axis (the kernel zero-padded to a multiple of the stride).
        taps = [-(-k // s) for k, s in zip(weight.shape[2:], strides, strict=True)]
        # Each phase's convolution covers size + taps - 1 positions; the output must fit in them
        # (an output_padding beyond the end padding would read past them).
        if any(
            o + b > s * (n + t - 1)
            for o, b, s, n, t in zip(out[2:], before, strides, sizes, taps, strict=True)
        ):
            return post
        # The phases' kernel is the transposed one zero-padded to a multiple of the stride, up
        # to four times its bytes: no larger than a fold may make a constant (a tiny file can
        # fold into a kernel just under that limit).
        if (
            weight.itemsize
            * math.prod(weight.shape[:2])
            * math.prod(t * s for t, s in zip(taps, strides, strict=True))
            > constant_limit()
        ):
            return post
        kernel = _phase_kernel(weight, strides, taps)
        full = relay.nn.conv2d(
            data,
            relay.const(kernel),
            padding=(taps[0] - 1, taps[1] - 1, taps[0] - 1, taps[1] - 1),
            channels=kernel.shape[0],
            kernel_size=taps,
            out_dtype=attrs.out_dtype,
        )
        rows, cols = (n + t - 1 for n, t in zip(sizes, taps, strict=True))
        batch, channels = out[:2]
        phases = relay.reshape(full, (batch, channels, strides[0], strides[1], rows, cols))
        interleaved = relay.reshape(
            relay.transpose(phases, (0, 1, 4, 2, 5, 3)),
            (batch, channels, rows * strides[0], cols * strides[1]),
        )
        return relay.strided_slice(
            interleaved,
            begin=(0, 0, before[0], before[1]),
            end=(batch, channels, before[0] + out[2], before[1] + out[3]),
        )


def _phase_kernel(
    weight: np.ndarray[Any, Any], strides: list[int], taps: list[int]
) -> np.ndarray[Any, Any]:
    """The OIHW kernel of every phase's convolution, output channel ``c * sh * sw + ph * sw +
    pw`` for phase (ph, pw) of channel c: tap ``t`` of a phase is the transposed kernel's
    ``s * t + phase``, reversed, because a transposed convolution scatters where a
    convolution gathers."""
    cin, cout, kh, kw = weight.shape
    (sh, sw), (th, tw) = strides, taps
    padded = np.zeros((cin, cout, th * sh, tw * sw), weight.dtype)
    padded[:, :, :kh, :kw] = weight
    split = padded.reshape(cin, cout, th, sh, tw, sw)[:, :, ::-1, :, ::-1, :]
    return np.ascontiguousarray(split.transpose(1, 3, 5, 0, 2, 4).reshape(-1, cin, th, tw))


def _transposed_kernels(mod: IRModule) -> list[relay.Expr]:
    """The kernel of each transposed convolution in ``mod``'s main."""
    kernels: list[relay.Expr] = []

    def visit(node: Any) -> None:
        if isinstance(node, relay.Call) and getattr(node.op, "name", None) == "nn.conv2d_transpose":
            kernels.append(node.args[1])

    relay.analysis.post_order_visit(mod["main"], visit)
    return kernels


def subpixel_convolutions(mod: IRModule, params: Params) -> tuple[IRModule, Params]:
    """``mod`` with each transposed convolution by a known kernel as its phases' convolution.

    Kernels given in ``params`` (PyTorch's frontend keeps weights there) are bound into the
    module first, and leave ``params``. A module without a transposed convolution is returned
    as it is, untyped where it was (a PyTorch conversion's main may name Prelude types its
    module no longer defines).
    """
    kernels = _transposed_kernels(mod)
    if not kernels:
        return mod, params
    bound = {k.name_hint for k in kernels if isinstance(k, relay.Var) and k.name_hint in params}
    typed = relay.transform.InferType()(mod)
    if bound:
        typed["main"] = bind_params_by_name(typed["main"], {n: params[n] for n in bound})
        params = {name: value for name, value in params.items() if name not in bound}
    typed["main"] = rewrite(_Subpixel(), typed["main"])
    return relay.transform.InferType()(typed), params
