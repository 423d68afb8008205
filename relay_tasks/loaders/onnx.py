"""ONNX files, converted with TVM's ONNX frontend (weights frozen in, as tvmc does)."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from tvm.ir import IRModule

from ..errors import ModelError, describe_failure
from .frontend import DTypes, Params, Shapes, convert, require, unknown_inputs
from .matmul import dense_weights
from .values import values_in_numpy


def load_onnx(
    path: Path, shapes: Shapes | None = None, dtypes: DTypes | None = None
) -> tuple[IRModule, Params]:
    """Convert an ONNX model; ``shapes`` fix dynamic input dimensions, ``dtypes`` input types."""
    onnx = require("onnx", "reading ONNX models needs the onnx package: pip install onnx==1.15.0")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:
        raise ModelError(f"{path}: not a valid ONNX model ({describe_failure(err)})") from err
    # onnx's own reader follows whatever a location names, symlinks included (CVE-2024-27318,
    # still in 1.15.0, pinned here, and 1.16.2), and opens FIFOs: the weights are read here.
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _read_external(path, tensor)
    try:
        onnx.checker.check_model(model)
    except Exception as err:
        raise ModelError(f"{path}: not a valid ONNX model ({describe_failure(err)})") from err
    inputs = _input_shapes(model, path, shapes)
    unknown_inputs(path, list(dtypes or {}), list(inputs))
    from tvm.relay.frontend import onnx as frontend

    with values_in_numpy(frontend):
        return convert(
            path,
            "ONNX",
            lambda: _dense(
                frontend.from_onnx(
                    model, shape=inputs, dtype=dict(dtypes or {}) or "float32", freeze_params=True
                )
            ),
        )


def _dense(converted: tuple[IRModule, Params]) -> tuple[IRModule, Params]:
    """The frontend's module with its MatMuls by 2-D weights as dense layers (see
    :mod:`.matmul`)."""
    mod, params = converted
    return dense_weights(mod), params


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


#: A location's path components: plain names (no ``..``, no hidden or absolute paths).
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}\Z")
_NO_LINKS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _read_external(path: Path, tensor: Any) -> None:
    """Put a tensor's external data into the tensor, read from a regular file in the model's
    own folder tree: each component of its location opened without following a link, the byte
    range checked against the file's size before anything is read."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = str(info.get("location", ""))
    parts = location.split("/")
    if not all(_COMPONENT.match(part) for part in parts):
        _refuse(path, location, "is not a path of plain names inside the model's folder")
    try:
        offset, length = int(info.get("offset", 0)), info.get("length")
        length = None if length is None else int(length)
    except ValueError:
        _refuse(path, location, "has an offset or length that is not a number")
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            inner = os.open(part, _NO_LINKS | os.O_DIRECTORY, dir_fd=folder)
            os.close(folder)
            folder = inner
        fd = os.open(parts[-1], _NO_LINKS | os.O_NONBLOCK, dir_fd=folder)
    except OSError as err:
        why = "passes through a symlink" if err.errno in (errno.ELOOP, errno.ENOTDIR) else ""
        _refuse(path, location, why or f"cannot be opened ({err.strerror})")
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno())
        if not stat.S_ISREG(size.st_mode):
            _refuse(path, location, "is not a regular file")
        end = size.st_size if length is None else offset + length
        if not 0 <= offset <= end <= size.st_size:
            _refuse(
                path, location, f"asks for bytes {offset} to {end} of a {size.st_size}-byte file"
            )
        handle.seek(offset)
        tensor.raw_data = handle.read(end - offset)
    del tensor.external_data[:]
    tensor.data_location = type(tensor).DEFAULT


def _refuse(path: Path, location: str, why: str) -> NoReturn:
    raise ModelError(
        f"{path}: external tensor data {location!r} {why}; relay-tasks reads weights only from "
        "regular files in the model's folder (copy them there)"
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
