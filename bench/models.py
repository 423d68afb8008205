"""The bench's models, one or more per class, built once and cached as Relay JSON + params.

Classes: CNNs (``tvm.relay.testing``), transformers from PyTorch (a BERT-base encoder at several
depths, a GPT-2 decoder, built from Hugging Face configs with seeded random weights), graphs from
``torch.onnx.export`` (a ResNet-50 and a BERT encoder), an ONNX graph whose weights are computed
in-graph from ``ConstantOfShape``, small models (a handful of ops; a single operator), and
families traced to TorchScript files and loaded from them as ``relay-tasks extract FILE.pt``
does (a T5 encoder, a Llama decoder, a Swin transformer, DeepLabV3, ConvNeXt, EfficientNet).

Frontends run once per model, in the parent process; each measured process then loads the same
cached module, so both sides extract from the identical module and neither pays for torch.
Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOKENS = (1, 128)
#: Encoder depths of the sweep (``bert-base-L<n>``).
SWEEP_DEPTHS = (1, 4, 12, 24)


def _torch_module(builder: Callable[[], Any], example: Callable[[], Any]) -> Any:
    import torch

    from relay_tasks import load_model

    torch.manual_seed(0)
    module = builder().eval()
    return load_model(module, example_inputs=example())


def _tokens() -> Any:
    import torch

    return torch.randint(0, 1000, TOKENS, dtype=torch.int64)


def _bert(layers: int) -> Callable[[], Any]:
    def build() -> Any:
        import transformers

        config = transformers.BertConfig(num_hidden_layers=layers, torchscript=True)
        return _torch_module(lambda: transformers.BertModel(config), _tokens)

    return build


def _gpt2() -> Any:
    import transformers

    config = transformers.GPT2Config(n_layer=12, torchscript=True)
    return _torch_module(lambda: transformers.GPT2Model(config), _tokens)


def _onnx_export(builder: Callable[[], Any], example: Callable[[], Any], name: str) -> Any:
    import torch

    from relay_tasks import load_model

    torch.manual_seed(0)
    module = builder().eval()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name}.onnx"
        with torch.no_grad():
            torch.onnx.export(module, (example(),), str(path), input_names=["input"])
        return load_model(path)


def _resnet50_onnx() -> Any:
    import torch
    import torchvision

    return _onnx_export(
        lambda: torchvision.models.resnet50(weights=None),
        lambda: torch.randn(1, 3, 224, 224),
        "resnet50",
    )


def _bert_onnx() -> Any:
    import transformers

    config = transformers.BertConfig(num_hidden_layers=12, torchscript=True)
    return _onnx_export(lambda: transformers.BertModel(config), _tokens, "bert")


def _constant_of_shape() -> Any:
    """A 12-conv ONNX network whose weights and biases are ``ConstantOfShape`` outputs scaled
    by ``Range``-derived tensors, as some exporters write them: the weights are computed by
    the graph, so the fold does all the work upstream compiles."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from relay_tasks import load_model

    nodes, inits = [], []
    channels, current = 3, "input"
    for i in range(12):
        out_ch = 32 if i < 6 else 64
        shape = np.array([out_ch, channels, 3, 3], dtype=np.int64)
        inits.append(numpy_helper.from_array(shape, f"wshape{i}"))
        inits.append(numpy_helper.from_array(np.array([out_ch], np.int64), f"bshape{i}"))
        fill = helper.make_tensor(f"fill{i}", TensorProto.FLOAT, [1], [0.01 * (i + 1)])
        nodes += [
            helper.make_node("ConstantOfShape", [f"wshape{i}"], [f"w{i}"], value=fill),
            helper.make_node("ConstantOfShape", [f"bshape{i}"], [f"b{i}"], value=fill),
            helper.make_node("Conv", [current, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        channels, current = out_ch, f"r{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [current], ["output"]))
    graph = helper.make_graph(
        nodes,
        "constant_of_shape",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 56, 56])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, channels, 1, 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "constant_of_shape.onnx"
        onnx.save(model, str(path))
        return load_model(path)


def _small() -> Any:
    """dense, relu, dense, softmax: a handful of ops."""
    import numpy as np
    import tvm
    from tvm import relay

    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, 256))
    w1, w2 = relay.var("w1", shape=(512, 256)), relay.var("w2", shape=(10, 512))
    out = relay.nn.softmax(relay.nn.dense(relay.nn.relu(relay.nn.dense(x, w1)), w2))
    params = {
        "w1": tvm.nd.array(rng.standard_normal((512, 256)).astype("float32")),
        "w2": tvm.nd.array(rng.standard_normal((10, 512)).astype("float32")),
    }
    return tvm.IRModule.from_expr(relay.Function([x, w1, w2], out)), params


def _single_op() -> Any:
    """One conv2d: the fixed cost of an extraction."""
    import numpy as np
    import tvm
    from tvm import relay

    x = relay.var("x", shape=(1, 64, 56, 56))
    w = relay.var("w", shape=(64, 64, 3, 3))
    out = relay.nn.conv2d(x, w, padding=(1, 1), channels=64, kernel_size=(3, 3))
    weights = np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype("float32")
    return tvm.IRModule.from_expr(relay.Function([x, w], out)), {"w": tvm.nd.array(weights)}


IMAGE = (1, 3, 224, 224)


def _t5() -> tuple[Any, Any]:
    """A T5-small encoder: relative position buckets (log, abs, minimum, where, casts)."""
    import transformers

    config = transformers.T5Config(num_layers=6, d_model=512, num_heads=8, torchscript=True)
    return transformers.T5EncoderModel(config), _tokens()


def _llama(layers: int = 4) -> tuple[Any, Any]:
    """A Llama decoder (4 layers unless told): rotary tables (cos, sin), a causal mask (trilu)."""
    import transformers

    config = transformers.LlamaConfig(
        num_hidden_layers=layers, hidden_size=512, intermediate_size=1376, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=32000, torchscript=True,
    )  # fmt: skip
    return transformers.LlamaModel(config), _tokens()


def _swin() -> tuple[Any, Any]:
    """A Swin-T vision transformer: shifted windows, relative position bias tables."""
    import transformers

    return transformers.SwinModel(transformers.SwinConfig(torchscript=True)), _image()


def _torchvision(name: str, **kwargs: Any) -> Callable[[], tuple[Any, Any]]:
    def build() -> tuple[Any, Any]:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kwargs), _image()

    return build


def _deeplab() -> tuple[Any, Any]:
    """DeepLabV3 (ResNet-50): atrous convolutions, atrous pyramid pooling, upsampling."""
    import torchvision

    model = torchvision.models.segmentation.deeplabv3_resnet50(
        weights=None, weights_backbone=None, aux_loss=False
    )
    return model, _image()


def _image() -> Any:
    import torch

    return torch.randn(IMAGE)


#: Families traced to TorchScript and loaded from the file: name -> (builder, input shapes).
TRACED: dict[str, tuple[Callable[[], tuple[Any, Any]], str]] = {
    "t5-encoder": (_t5, "input0:[1,128]:int64"),
    "llama-decoder": (_llama, "input0:[1,128]:int64"),
    "swin-tiny": (_swin, "input0:[1,3,224,224]"),
    "deeplabv3": (_deeplab, "input0:[1,3,224,224]"),
    "convnext-tiny": (_torchvision("convnext_tiny"), "input0:[1,3,224,224]"),
    "efficientnet-b0": (_torchvision("efficientnet_b0"), "input0:[1,3,224,224]"),
}


def traced_file(name: str, folder: Path) -> tuple[Path, str]:
    """The family's TorchScript file (traced now if missing, seeded) and its input shapes."""
    import torch

    build, shapes = TRACED[name]
    path = folder / f"{name}-{_digest()}.pt"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        module, example = build()
        with torch.no_grad():
            traced = torch.jit.trace(_first_output(module.eval()), example, strict=False)
        traced.save(str(path))
    return path, shapes


def _first_output(module: Any) -> Any:
    """``module`` returning one tensor, which tracing needs (a segmentation model returns a
    dict, Hugging Face models tuples)."""
    import torch

    class FirstOutput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, x: Any) -> Any:
            out = self.inner(x)
            if isinstance(out, dict):
                out = out["out"]
            return out[0] if isinstance(out, (tuple, list)) else out

    return FirstOutput()


def _from_file(name: str) -> Callable[[Path], Any]:
    def build(folder: Path) -> Any:
        from relay_tasks import load_model
        from relay_tasks.loaders import parse_shapes

        path, shapes = traced_file(name, folder)
        given, dtypes = parse_shapes(shapes)
        return load_model(path, shapes=given, dtypes=dtypes)

    return build


#: Bench name -> (class, builder).
BENCH_MODELS: dict[str, tuple[str, Callable[[], Any]]] = {
    "bert-base": ("transformer (PyTorch)", _bert(12)),
    "gpt2": ("transformer (PyTorch)", _gpt2),
    "resnet-50-onnx": ("frontend graph (ONNX)", _resnet50_onnx),
    "bert-onnx": ("frontend graph (ONNX)", _bert_onnx),
    "constant-of-shape": ("frontend graph (ONNX)", _constant_of_shape),
    "small": ("small model", _small),
    "single-op": ("small model", _single_op),
    **{name: ("traced (PyTorch file)", _from_file(name)) for name in TRACED},
    **{f"bert-base-L{n}": ("depth sweep", _bert(n)) for n in SWEEP_DEPTHS if n != 12},
}


def cached(name: str, folder: Path) -> Path:
    """The cached module of a bench model (built now if missing): ``<folder>/<name>.json``,
    its params beside it. The file name carries the builder's source hash, so a changed
    builder is rebuilt."""
    import tvm
    from tvm import relay

    _, build = BENCH_MODELS[name]
    path = folder / f"{name}-{_digest()}.json"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        mod, params = build(folder) if name in TRACED else build()
        params_path = path.with_suffix(".params")
        params_path.write_bytes(relay.save_param_dict(dict(params)))
        path.write_text(tvm.ir.save_json(mod))
    return path


def _digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def load_cached(path: Path) -> tuple[Any, dict[str, Any]]:
    """A cached bench module and its params."""
    import tvm
    from tvm import relay

    mod = tvm.ir.load_json(path.read_text())
    params = dict(relay.load_param_dict(path.with_suffix(".params").read_bytes()))
    return mod, params
