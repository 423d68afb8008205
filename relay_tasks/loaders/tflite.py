"""TFLite flatbuffers, converted with TVM's TFLite frontend."""

from __future__ import annotations

from pathlib import Path

from tvm import relay
from tvm.ir import IRModule

from ..errors import ModelError, describe_failure
from .frontend import DTypes, Params, Shapes, convert, require, unknown_inputs


def load_tflite(
    path: Path, shapes: Shapes | None = None, dtypes: DTypes | None = None
) -> tuple[IRModule, Params]:
    """Convert a TFLite model; ``shapes`` and ``dtypes`` override its inputs' own."""
    tflite = require("tflite", "reading TFLite models needs the tflite package: pip install tflite")
    try:
        blob = path.read_bytes()
        model = tflite.Model.GetRootAsModel(blob, 0)
        subgraph = model.Subgraphs(0)
        names = [
            subgraph.Tensors(subgraph.Inputs(i)).Name().decode()
            for i in range(subgraph.InputsLength())
        ]
    except Exception as err:
        raise ModelError(f"{path}: not a valid TFLite model ({describe_failure(err)})") from err
    unknown_inputs(path, [*(shapes or {}), *(dtypes or {})], names)
    return convert(
        path,
        "TFLite",
        lambda: relay.frontend.from_tflite(
            model, shape_dict=dict(shapes or {}) or None, dtype_dict=dict(dtypes or {}) or None
        ),
    )
