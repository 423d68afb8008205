"""ONNX files, converted with TVM's ONNX frontend (weights frozen in, as tvmc does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tvm import relay
from tvm.ir import IRModule

from ..errors import ModelError, describe_failure
from .frontend import DTypes, Params, Shapes, convert, require, unknown_inputs


def load_onnx(
    path: Path, shapes: Shapes | None = None, dtypes: DTypes | None = None
) -> tuple[IRModule, Params]:
    """Convert an ONNX model; ``shapes`` fix dynamic input dimensions, ``dtypes`` input types."""
    onnx = require("onnx", "reading ONNX models needs the onnx package: pip install onnx==1.15.0")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:
        raise ModelError(f"{path}: not a valid ONNX model ({describe_failure(err)})") from err
    inputs = _input_shapes(model, path, shapes)
    unknown_inputs(path, list(dtypes or {}), list(inputs))
    return convert(
        path,
        "ONNX",
        lambda: relay.frontend.from_onnx(
            model, shape=inputs, dtype=dict(dtypes or {}) or "float32", freeze_params=True
        ),
    )


def _input_shapes(model: Any, path: Path, shapes: Shapes | None) -> dict[str, list[int]]:
    given = dict(shapes or {})
    initializers = {init.name for init in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    unknown_inputs(path, list(given), [v.name for v in inputs])
    result: dict[str, list[int]] = {}
    for value in inputs:
        if value.name in given:
            result[value.name] = list(given[value.name])
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
    return result
