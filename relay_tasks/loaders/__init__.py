"""Models in: built-in zoo names, Relay text (+ params), ONNX, TFLite and PyTorch.

One module per format, each a small function from a file or object to ``(IRModule, params)``;
every failure is a :class:`ModelError` (or a :class:`DependencyError` for a missing optional
frontend package) that names the file and the cause. Optional packages are imported only by the
loader that needs them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tvm.ir import IRModule

from ..errors import ModelError, UsageError
from .fastmath import approximate_math
from .frontend import DTypes, Params, Shapes
from .zoo import MODELS, load_zoo_model

FORMATS = ("zoo", "relay", "onnx", "tflite", "pytorch")
_SUFFIXES = {
    ".relay": "relay",
    ".txt": "relay",
    ".rly": "relay",
    ".onnx": "onnx",
    ".tflite": "tflite",
    ".pt": "pytorch",
    ".pth": "pytorch",
    ".torchscript": "pytorch",
}


def load_model(
    source: Any,
    *,
    params: str | Path | None = None,
    model_format: str | None = None,
    shapes: Shapes | None = None,
    dtypes: DTypes | None = None,
    example_inputs: Any = None,
    exact_math: bool = False,
) -> tuple[IRModule, Params]:
    """Load a model by built-in name, from a file, or from a PyTorch module object.

    Parameters
    ----------
    source : str, pathlib.Path, torch.nn.Module or torch.jit.ScriptModule
        A built-in model name (see :data:`relay_tasks.loaders.zoo.MODELS`), a model file, or a
        PyTorch module (traced in eval mode without gradients, then converted).
    params : str or pathlib.Path, optional
        A params file written by ``relay.save_param_dict``; Relay text models only.
    model_format : {"zoo", "relay", "onnx", "tflite", "pytorch"}, optional
        Overrides the format guessed from the file suffix.
    shapes : dict of str to list of int, optional
        Input shapes by input name: for inputs with dynamic dimensions, for every input of a
        PyTorch model (in input order), as tvmc requires, or to retype a Relay text model's
        inputs (another batch size).
    dtypes : dict of str to str, optional
        Input dtypes by name where they are not the model's own (PyTorch: not float32).
    example_inputs : torch.Tensor or tuple of torch.Tensor, optional
        What a PyTorch module is traced with (instead of zeros of ``shapes``).
    exact_math : bool, default False
        Keep a converted model's ``exp``, ``erf``, ``tanh`` and softmax as its frontend gives
        them (libm's), instead of TVM's approximations (:mod:`.fastmath`). Built-in models and
        Relay text are taken as they are either way. The tasks differ, so tune and compile a
        model alike.
    """
    if not isinstance(source, (str, Path)):
        from .pytorch import load_torch_module

        mod, loaded = load_torch_module(source, example_inputs, shapes=shapes, dtypes=dtypes)
        return _math(mod, exact_math), loaded
    text = str(source)
    kind = model_format or _guess_format(text)
    if kind not in FORMATS:
        raise ModelError(f"unknown model format {kind!r}; choose one of {', '.join(FORMATS)}")
    if params is not None and kind != "relay":
        raise ModelError(f"{text}: --params applies to Relay text models only; drop it")
    if example_inputs is not None and kind != "pytorch":
        raise ModelError(f"{text}: example_inputs apply to PyTorch models only")
    if kind == "zoo":
        if shapes or dtypes:
            raise ModelError(f"built-in model {text!r} has fixed input shapes; drop --input-shapes")
        return load_zoo_model(text)
    path = Path(text)
    if not path.is_file():
        raise ModelError(f"{text}: no such file")
    mod, loaded = load_file_confined(kind, path, params, shapes, dtypes)
    return _math(mod, exact_math or kind == "relay"), loaded


def _math(mod: IRModule, exact: bool) -> IRModule:
    """A converted model with TVM's approximations, unless asked for exact functions: TOPI's
    ``erf`` calls libm per element (3.5 of BERT-2's 26 ms), its approximation does not."""
    return mod if exact else approximate_math(mod)


def load_file_confined(
    kind: str, path: Path, params: str | Path | None, shapes: Shapes | None, dtypes: DTypes | None
) -> tuple[IRModule, Params]:
    """:func:`load_file` in a confined child (:mod:`relay_tasks.sandbox`), which hands back
    the converted model as Relay text and params bytes, read here as such files are read."""
    from ..sandbox import run_confined
    from .relay_text import pack_model, unpack_model

    def convert() -> list[bytes | memoryview]:
        return pack_model(*load_file(kind, path, params, shapes, dtypes))

    return unpack_model(run_confined(convert, f"reading {path}"), path)


def load_file(
    kind: str, path: Path, params: str | Path | None, shapes: Shapes | None, dtypes: DTypes | None
) -> tuple[IRModule, Params]:
    if kind == "relay":
        from .relay_text import load_params, load_relay_text, with_input_types

        mod = load_relay_text(path)
        if shapes or dtypes:
            mod = with_input_types(path, mod, shapes or {}, dtypes or {})
        return mod, load_params(Path(params)) if params is not None else {}
    if kind == "onnx":
        from .onnx import load_onnx

        return load_onnx(path, shapes, dtypes)
    if kind == "tflite":
        from .tflite import load_tflite

        return load_tflite(path, shapes, dtypes)
    from .pytorch import load_torchscript

    return load_torchscript(path, shapes, dtypes)


def _guess_format(text: str) -> str:
    if text in MODELS and not Path(text).exists():
        return "zoo"
    suffix = Path(text).suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    if not Path(text).exists():
        raise ModelError(
            f"{text}: no such file, and not a built-in model (built-ins: {', '.join(MODELS)})"
        )
    known = ", ".join(sorted(_SUFFIXES))
    raise ModelError(
        f"{text}: cannot tell the model format from the suffix {suffix or '(none)'!r} "
        f"(known: {known}); name it with --model-format {'|'.join(FORMATS[1:])}"
    )


_SPEC = re.compile(r"([^\s,:\[\]]+):\[([^\]]*)\](?::([A-Za-z][A-Za-z0-9_]*))?")


def parse_shapes(text: str) -> tuple[dict[str, list[int]], dict[str, str]]:
    """tvmc's ``--input-shapes`` spelling, plus an optional dtype after a shape:
    ``"data:[1,3,224,224] input_ids:[1,128]:int64"`` -> (shapes, dtypes)."""
    shapes: dict[str, list[int]] = {}
    dtypes: dict[str, str] = {}
    for name, dims, dtype in _SPEC.findall(text):
        try:
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise UsageError(f"input shape for {name!r} must be integers, got [{dims}]") from None
        if dtype:
            dtypes[name] = _checked_dtype(name, dtype)
    leftover = _SPEC.sub("", text).strip(" ,")
    if leftover or not shapes:
        raise UsageError(
            f"cannot read input shapes {text!r}; write them as name:[d0,d1,...] with an "
            "optional :dtype, e.g. --input-shapes 'data:[1,3,224,224] ids:[1,128]:int64'"
        )
    return shapes, dtypes


def _checked_dtype(name: str, dtype: str) -> str:
    import tvm

    try:
        tvm.DataType(dtype)
    except (ValueError, tvm.TVMError):
        raise UsageError(
            f"input {name!r}: unknown dtype {dtype!r}; use e.g. float32, float16, int64, int32"
        ) from None
    return dtype


__all__ = ["FORMATS", "load_model", "parse_shapes"]
