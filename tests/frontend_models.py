"""Models from real frameworks, as users bring them: torchvision and Hugging Face networks traced
and converted by TVM's PyTorch frontend, the same torchvision networks exported to ONNX, and a
TFLite flatbuffer. Built once per session with seeded random weights; nothing is downloaded
(Hugging Face models come from configs, with the hub switched off in conftest.py)."""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tvm

from relay_tasks import load_model

Model = tuple[tvm.IRModule, dict[str, tvm.nd.NDArray]]
IMAGE = (1, 3, 224, 224)
TOKENS = (1, 128)


def _torchvision(name: str) -> Callable[[], Any]:
    def build() -> Any:
        import torchvision

        return getattr(torchvision.models, name)(weights=None), _image()

    return build


def _image() -> Any:
    import torch

    return torch.randn(IMAGE)


def _tokens() -> Any:
    import torch

    return torch.randint(0, 1000, TOKENS, dtype=torch.int64)


def _bert() -> Any:
    import transformers

    config = transformers.BertConfig(num_hidden_layers=2, torchscript=True)
    return transformers.BertModel(config), _tokens()


def _gpt2() -> Any:
    import transformers

    config = transformers.GPT2Config(n_layer=2, torchscript=True)
    return transformers.GPT2Model(config), _tokens()


def _vit() -> Any:
    import transformers

    config = transformers.ViTConfig(
        num_hidden_layers=2,
        hidden_size=192,
        num_attention_heads=3,
        intermediate_size=768,
        torchscript=True,
    )
    return transformers.ViTModel(config), _image()


def _t5() -> Any:
    """Relative position buckets (``log``, ``abs``, ``minimum``, ``where``, float-int casts):
    constant subgraphs TVM's fold compiles call by call."""
    import transformers

    config = transformers.T5Config(
        num_layers=2, d_model=128, d_kv=32, d_ff=256, num_heads=4, vocab_size=1000,
        torchscript=True,
    )  # fmt: skip
    return transformers.T5EncoderModel(config), _tokens()


def _llama() -> Any:
    """Rotary tables (``cos``, ``sin``, a product of constants) and a causal mask (``trilu``)."""
    import transformers

    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=1000, torchscript=True,
    )  # fmt: skip
    return transformers.LlamaModel(config), _tokens()


#: PyTorch modules (and their example inputs): name -> (builder, pytest marks).
TORCH_MODELS: dict[str, tuple[Callable[[], Any], tuple[Any, ...]]] = {
    "torchvision-resnet18": (_torchvision("resnet18"), ()),
    "torchvision-squeezenet1_1": (_torchvision("squeezenet1_1"), ()),
    "torchvision-mobilenet_v2": (_torchvision("mobilenet_v2"), (pytest.mark.slow,)),
    "bert-2-layers": (_bert, ()),
    "gpt2-2-layers": (_gpt2, ()),
    "vit-small": (_vit, ()),
    "t5-2-layers": (_t5, (pytest.mark.slow,)),
    "llama-2-layers": (_llama, (pytest.mark.slow,)),
}
#: The torchvision models again, exported with torch.onnx.export and loaded as ONNX files.
ONNX_EXPORTS = {
    f"{name}-onnx": marks for name, (_, marks) in TORCH_MODELS.items() if "torchvision" in name
}
#: Ops each model's MetaSchedule tasks must show, so no row passes on nothing.
MUST_SHOW = {
    "torchvision-resnet18": ("conv2d", "dense", "max_pool2d"),
    "torchvision-squeezenet1_1": ("conv2d", "avg_pool2d"),
    "torchvision-mobilenet_v2": ("conv2d", "dense"),
    "bert-2-layers": ("batch_matmul", "softmax", "take"),
    "gpt2-2-layers": ("batch_matmul", "softmax", "tanh"),
    "vit-small": ("conv2d", "batch_matmul", "softmax"),
    "t5-2-layers": ("batch_matmul", "softmax", "take"),
    "llama-2-layers": ("batch_matmul", "softmax", "sigmoid"),
}


def torch_module(name: str) -> tuple[Any, Any]:
    """A fresh module in eval mode and its example input, seeded."""
    import torch

    torch.manual_seed(0)
    module, example = TORCH_MODELS[name][0]()
    return module.eval(), example


@functools.cache
def _converted(name: str) -> Model:
    if name.endswith("-onnx"):
        return load_model(onnx_file(name.removesuffix("-onnx")))
    module, example = torch_module(name)
    return load_model(module, example_inputs=example)


def load(name: str) -> Model:
    """A frontend model converted to Relay, as a private copy (upstream binds params into it)."""
    from zoo import copy_module

    mod, params = _converted(name)
    return copy_module(mod), params


@functools.cache
def onnx_file(name: str) -> Path:
    """A torchvision model exported to ONNX (torch's default opset), in a session folder."""
    import torch

    module, example = torch_module(name)
    path = Path(_folder()) / f"{name}.onnx"
    with torch.no_grad():
        torch.onnx.export(module, (example,), str(path), input_names=["input"])
    return path


@functools.cache
def _folder() -> str:
    folder = tempfile.mkdtemp(prefix="relay-tasks-frontends-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # 45 MB a session, else left
    return folder


@functools.cache
def _from_get_network(name: str) -> Model:
    """``get_network`` converts in a forked pool, whose child hangs in a process that has run
    torch (its thread pool does not survive a fork): it runs first in a fresh process, filling
    its own cache, which the call here then reads (upstream's code both times)."""
    from tvm.meta_schedule.testing.relay_workload import get_network

    cache = _folder()
    build = (f"from tvm.meta_schedule.testing.relay_workload import get_network; "
             f"get_network({name!r}, {list(IMAGE)!r}, cache_dir={cache!r})")  # fmt: skip
    subprocess.run([sys.executable, "-c", build], cwd=cache, check=True, capture_output=True)
    mod, params, _ = get_network(name, list(IMAGE), cache_dir=cache)
    return mod, dict(params.items())


def from_get_network(name: str) -> Model:
    """A network as upstream's MetaSchedule test helper ``get_network`` builds it (traced before
    ``.eval()``, so BatchNorm counters come back as params ``main`` never reads; NHWC layout), as
    a private copy."""
    from zoo import copy_module

    mod, params = _from_get_network(name)
    return copy_module(mod), params


def model_rows() -> list[Any]:
    rows = [pytest.param(name, marks=marks, id=name) for name, (_, marks) in TORCH_MODELS.items()]
    rows += [pytest.param(name, marks=marks, id=name) for name, marks in ONNX_EXPORTS.items()]
    return rows
