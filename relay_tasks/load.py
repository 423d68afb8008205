"""Load models: built-in zoo names, Relay text (+ params file), ONNX and TFLite files.

Each loader returns ``(IRModule, params)``; every failure is a :class:`ModelError` (or a
:class:`DependencyError` for a missing frontend package) that names the file and the cause.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tvm
from tvm import relay
from tvm.ir import IRModule

from .errors import DependencyError, ModelError
from .inputs import diagnostic_text, diagnostics
from .zoo import MODELS, load_zoo_model

Params = dict[str, tvm.nd.NDArray]
Shapes = Mapping[str, Sequence[int]]

FORMATS = ("zoo", "relay", "onnx", "tflite")
_SUFFIXES = {
    ".relay": "relay",
    ".txt": "relay",
    ".rly": "relay",
    ".onnx": "onnx",
    ".tflite": "tflite",
}


def load_model(
    source: str | Path,
    *,
    params: str | Path | None = None,
    model_format: str | None = None,
    shapes: Shapes | None = None,
) -> tuple[IRModule, Params]:
    """Load a model by built-in name or from a file.

    Parameters
    ----------
    source : str or pathlib.Path
        A built-in model name (see :data:`relay_tasks.zoo.MODELS`) or a model file.
    params : str or pathlib.Path, optional
        A params file written by ``relay.save_param_dict``; Relay text models only.
    model_format : {"zoo", "relay", "onnx", "tflite"}, optional
        Overrides the format guessed from the file suffix.
    shapes : dict of str to list of int, optional
        Input shapes by input name, for models whose inputs are not fully static.
    """
    text = str(source)
    kind = model_format or _guess_format(text)
    if params is not None and kind != "relay":
        raise ModelError(f"{text}: --params applies to Relay text models only; drop it")
    if kind == "zoo":
        if shapes:
            raise ModelError(f"built-in model {text!r} has fixed input shapes; drop --input-shapes")
        return load_zoo_model(text)
    path = Path(text)
    if not path.is_file():
        raise ModelError(f"{text}: no such file")
    if kind == "relay":
        mod = load_relay_text(path)
        return mod, load_params(Path(params)) if params is not None else {}
    if kind == "onnx":
        return load_onnx(path, shapes)
    if kind == "tflite":
        return load_tflite(path, shapes)
    raise ModelError(f"unknown model format {kind!r}; choose one of {', '.join(FORMATS)}")


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


def parse_shapes(text: str) -> dict[str, list[int]]:
    """tvmc's ``--input-shapes`` spelling: ``"data:[1,3,224,224] mask:[1,128]"``."""
    shapes: dict[str, list[int]] = {}
    for item in re.findall(r"([^\s,:\[\]]+):\[([^\]]*)\]", text):
        name, dims = item
        try:
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise ModelError(f"input shape for {name!r} must be integers, got [{dims}]") from None
    leftover = re.sub(r"([^\s,:\[\]]+):\[([^\]]*)\]", "", text).strip(" ,")
    if leftover or not shapes:
        raise ModelError(
            f"cannot read input shapes {text!r}; write them as name:[d0,d1,...], "
            "e.g. --input-shapes 'data:[1,3,224,224]'"
        )
    return shapes


def load_relay_text(path: Path) -> IRModule:
    """Parse a Relay text file (as written by ``mod.astext()``)."""
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ModelError(f"{path}: cannot read the file as text ({err})") from err
    with diagnostics() as messages:
        try:
            return relay.parse(source, str(path))
        except tvm.TVMError as err:
            raise ModelError(
                f"{path}: not valid Relay text: {diagnostic_text(messages, err)}"
            ) from err


def load_params(path: Path) -> Params:
    """Read a params file written by ``relay.save_param_dict``."""
    try:
        blob = path.read_bytes()
    except OSError as err:
        raise ModelError(f"{path}: cannot read the params file ({err})") from err
    try:
        return dict(relay.load_param_dict(bytearray(blob)))
    except (tvm.TVMError, ValueError) as err:
        raise ModelError(f"{path}: not a params file written by relay.save_param_dict") from err


def load_onnx(path: Path, shapes: Shapes | None = None) -> tuple[IRModule, Params]:
    """Convert an ONNX model with TVM's ONNX frontend (weights frozen in, as tvmc does)."""
    try:
        import onnx
    except ImportError as err:
        raise DependencyError(
            "reading ONNX models needs the onnx package: pip install onnx==1.15.0"
        ) from err
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:
        raise ModelError(f"{path}: not a valid ONNX model ({_first_line(err)})") from err
    inputs = _onnx_input_shapes(model, path, shapes)
    return _convert(
        path, "ONNX", lambda: relay.frontend.from_onnx(model, shape=inputs, freeze_params=True)
    )


def _onnx_input_shapes(model: Any, path: Path, shapes: Shapes | None) -> dict[str, list[int]]:
    given = dict(shapes or {})
    initializers = {init.name for init in model.graph.initializer}
    result: dict[str, list[int]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if value.name in given:
            result[value.name] = list(given.pop(value.name))
            continue
        dims = value.type.tensor_type.shape.dim
        static = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims
        ]
        if None in static:
            dynamic = dims[static.index(None)].dim_param or "?"
            raise ModelError(
                f"{path}: input {value.name!r} has a dynamic dimension ({dynamic!r}); give its "
                f"shape with --input-shapes '{value.name}:[...]'"
            )
        result[value.name] = [int(d) for d in static]  # type: ignore[arg-type]
    if given:
        inputs = ", ".join(result) or "(none)"
        raise ModelError(
            f"{path}: no input named {', '.join(sorted(given))}; the inputs are {inputs}"
        )
    return result


def load_tflite(path: Path, shapes: Shapes | None = None) -> tuple[IRModule, Params]:
    """Convert a TFLite flatbuffer with TVM's TFLite frontend."""
    try:
        import tflite
    except ImportError as err:
        raise DependencyError(
            "reading TFLite models needs the tflite package: pip install tflite"
        ) from err
    try:
        blob = path.read_bytes()
        model = tflite.Model.GetRootAsModel(blob, 0)
        subgraph = model.Subgraphs(0)
        names = [
            subgraph.Tensors(subgraph.Inputs(i)).Name().decode()
            for i in range(subgraph.InputsLength())
        ]
    except Exception as err:
        raise ModelError(f"{path}: not a valid TFLite model ({_first_line(err)})") from err
    unknown = sorted(set(shapes or {}) - set(names))
    if unknown:
        raise ModelError(
            f"{path}: no input named {', '.join(unknown)}; the inputs are {', '.join(names)}"
        )
    return _convert(
        path,
        "TFLite",
        lambda: relay.frontend.from_tflite(model, shape_dict=dict(shapes or {}) or None),
    )


def _convert(path: Path, frontend: str, convert: Any) -> tuple[IRModule, Params]:
    try:
        mod, params = convert()
    except tvm.error.OpNotImplemented as err:
        raise ModelError(
            f"{path}: TVM's {frontend} frontend cannot convert it: {_first_line(err)}"
        ) from err
    except Exception as err:
        raise ModelError(f"{path}: TVM's {frontend} frontend failed: {_first_line(err)}") from err
    return mod, dict(params)


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
