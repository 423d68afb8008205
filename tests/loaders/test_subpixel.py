"""Transposed convolutions reach TVM as convolutions of their phases and a pixel shuffle (TOPI's
x86 ``conv2d_transpose`` multiplies stuffed zeros: DCGAN ran 8x slower that way), computing
what TOPI's reference computes; forms the rewrite does not cover stay as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relay
from tvm.contrib import graph_executor
from tvm.topi.testing import conv2d_transpose_nchw_python

import relay_tasks
from relay_tasks import load_model
from relay_tasks.loaders.subpixel import subpixel_convolutions

from checks import ops_called


def _run(mod: tvm.IRModule, params: dict[str, Any], x: np.ndarray) -> np.ndarray:
    lib = relay.build(mod, target=relay_tasks.host_target(), params=params)
    graph = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    graph.set_input(0, x)
    graph.run()
    return graph.get_output(0).numpy()


def _transposed(
    size: tuple[int, int], kernel: tuple[int, int], **attrs: Any
) -> tuple[tvm.IRModule, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, *size)).astype("float32")
    w = rng.standard_normal((6, 5 * attrs.get("groups", 1), *kernel)).astype("float32")
    data = relay.var("x", shape=x.shape)
    conv = relay.nn.conv2d_transpose(data, relay.const(w), kernel_size=kernel, **attrs)
    return tvm.IRModule.from_expr(relay.Function([data], conv)), x, w


@pytest.mark.parametrize(
    ("size", "kernel", "strides", "padding", "output_padding"),
    [
        ((4, 4), (4, 4), (2, 2), (1, 1), (0, 0)),  # DCGAN's
        ((1, 1), (4, 4), (1, 1), (0, 0), (0, 0)),  # its first, from a 1x1 code
        ((5, 7), (3, 3), (2, 2), (1, 1), (1, 1)),  # a kernel no multiple of the stride
        ((6, 5), (4, 3), (3, 2), (2, 0, 1, 1), (1, 0)),  # uneven strides and padding
        ((3, 3), (2, 2), (2, 2), (0, 0), (0, 0)),  # a UNet's upsampling
    ],
)
def test_a_transposed_convolution_is_its_phases_convolution_and_computes_the_same(
    size: tuple[int, int],
    kernel: tuple[int, int],
    strides: tuple[int, int],
    padding: tuple[int, ...],
    output_padding: tuple[int, int],
) -> None:
    mod, x, w = _transposed(
        size, kernel, strides=strides, padding=padding, output_padding=output_padding
    )
    rewritten, params = subpixel_convolutions(mod, {})
    assert "nn.conv2d_transpose" not in ops_called(rewritten)
    assert "nn.conv2d" in ops_called(rewritten)
    pads = padding if len(padding) == 4 else (*padding, *padding)
    expected = conv2d_transpose_nchw_python(x, w, strides, pads, output_padding)
    np.testing.assert_allclose(_run(rewritten, params, x), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "attrs",
    [
        {"groups": 2, "strides": (2, 2)},
        {"dilation": (2, 2), "strides": (2, 2)},
        # An output_padding past the end padding: the phases do not reach the last row.
        {"strides": (2, 2), "output_padding": (1, 1)},
        # A stride past the kernel: phases no tap reaches, a kernel of zeros the stride's size.
        {"strides": (5, 1)},
    ],
)
def test_forms_the_rewrite_does_not_cover_stay_transposed_convolutions(
    attrs: dict[str, Any],
) -> None:
    mod, _, _ = _transposed((4, 4), (4, 4), **attrs)
    rewritten, _ = subpixel_convolutions(mod, {})
    assert tvm.ir.structural_equal(rewritten, relay.transform.InferType()(mod))


def test_a_phase_kernel_past_the_constant_limit_stays_a_transposed_convolution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3x3 at stride 2: the phases' kernel is 4x4, 1,920 bytes where the kernel takes 1,080."""
    mod, _, _ = _transposed((5, 7), (3, 3), strides=(2, 2))
    monkeypatch.setenv("RELAY_TASKS_MAX_CONSTANT_BYTES", "1500")
    rewritten, _ = subpixel_convolutions(mod, {})
    assert tvm.ir.structural_equal(rewritten, relay.transform.InferType()(mod))
    monkeypatch.setenv("RELAY_TASKS_MAX_CONSTANT_BYTES", "1920")
    assert "nn.conv2d_transpose" not in ops_called(subpixel_convolutions(mod, {})[0])


def _generator() -> nn.Module:
    return nn.Sequential(
        nn.ConvTranspose2d(8, 6, 4, 1, 0, bias=False),
        nn.ReLU(),
        nn.ConvTranspose2d(6, 3, 4, 2, 1, bias=True),
        nn.Tanh(),
    ).eval()


def test_a_pytorch_kernel_leaves_the_params_for_the_module(tmp_path: Path) -> None:
    """PyTorch's frontend keeps weights in params: the kernels move into the module, biases
    stay, and the model computes what torch does, through a file (the confined loader) too."""
    code = torch.randn(1, 8, 1, 1)
    generator = _generator()
    with torch.no_grad():
        expected = generator(code).numpy()
    mod, params = load_model(generator, example_inputs=code)
    assert "nn.conv2d_transpose" not in ops_called(mod)
    assert sorted(params) == ["aten::_convolution_1.bias"]
    np.testing.assert_allclose(_run(mod, params, code.numpy()), expected, rtol=1e-4, atol=1e-5)
    path = tmp_path / "generator.onnx"
    with torch.no_grad():
        torch.onnx.export(generator, (code,), str(path), input_names=["code"])
    mod, params = load_model(path)
    assert "nn.conv2d_transpose" not in ops_called(mod)
    np.testing.assert_allclose(_run(mod, params, code.numpy()), expected, rtol=1e-4, atol=1e-5)
