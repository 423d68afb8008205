"""ONNX files, converted with TVM's ONNX frontend (weights frozen in, as tvmc does)."""

from __future__ import annotations

from collections.abc import Iterator
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
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:
        raise ModelError(f"{path}: not a valid ONNX model ({describe_failure(err)})") from err
    # onnx.load follows whatever a location names, symlinks included (CVE-2024-27318; so do
    # 1.15.0, pinned here, and 1.16.2): check every location before any is read.
    for location in _external_locations(model):
        _check_location(path, location)
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
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


def _external_locations(model: Any) -> Iterator[str]:
    """The ``location`` of every tensor stored outside the file, subgraphs included."""
    for tensor in _tensors(model.graph):
        for entry in tensor.external_data:
            if entry.key == "location":
                yield str(entry.value)


def _tensors(graph: Any) -> Iterator[Any]:
    yield from graph.initializer
    yield from (sparse.values for sparse in graph.sparse_initializer)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def _check_location(path: Path, location: str) -> None:
    """External data must be a plain file inside the model's own directory tree."""
    folder = path.parent.resolve()
    target = folder / location
    inside = not Path(location).is_absolute() and target.resolve().is_relative_to(folder)
    links = [p for p in [target, *target.parents] if p.is_symlink() and p.is_relative_to(folder)]
    if not inside or links:
        why = f"through the symlink {links[0].name!r}" if links else "outside the model's folder"
        raise ModelError(
            f"{path}: external tensor data {location!r} lies {why}; relay-tasks reads weights "
            "only from regular files beside the model (copy them there)"
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
