"""Relay text files (``mod.astext()``) and params files (``relay.save_param_dict``)."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relay
from tvm.ir import IRModule

from ..errors import ModelError
from ..ir import diagnostic_text, diagnostics, node_key, raw_data, reads_of, rebuild
from .frontend import DTypes, Params, Shapes, unknown_inputs


def load_relay_text(path: Path) -> IRModule:
    """Parse a Relay text file. Parsing builds IR only: nothing in the file is executed."""
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ModelError(f"{path}: cannot read the file as text ({err})") from err
    return parse_relay_text(source, path)


def parse_relay_text(source: str, path: Path) -> IRModule:
    """Relay text read as a file of it is (``path`` names it in errors)."""
    source, _, metadata = source.partition(_METADATA)
    try:
        constants = read_metadata(metadata) if metadata.strip() else None
    except ValueError as err:
        raise ModelError(f"{path}: its #[metadata] section {err}; relay-tasks reads only "
                         "constants there, as mod.astext() writes them") from err  # fmt: skip
    with diagnostics() as messages:
        try:
            mod = relay.parse(source, str(path), None, constants)
        except tvm.TVMError as err:
            raise ModelError(
                f"{path}: not valid Relay text: {diagnostic_text(messages, err)}"
            ) from err
    for func in _functions(mod):
        refuse_external_code(path, func)
    return mod


#: Where ``astext`` starts the section of objects the text refers to as ``meta[...]``.
_METADATA = "\n#[metadata]\n"
#: Constants a metadata section may hold, and their bytes at most (the params of a large model).
MAX_CONSTANTS = 100_000
MAX_CONSTANT_BYTES = 4 << 30


def read_metadata(text: str) -> dict[str, list[relay.Constant]]:
    """The constants of a metadata section, read here; ``ValueError`` for anything else.

    The section is TVM object JSON, which TVM's reader turns into whatever node types it names
    (an attribute built from ``tir.call_extern("system", ...)`` reached an operator's compute).
    Here only its shape is read: a map of ``relay.Constant`` to a list of constants, and each
    constant's array, decoded from its bytes with every size checked first. The constants are
    made anew from the arrays (their types follow from them); nothing else of the JSON is used.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"is not JSON ({err.msg} at line {err.lineno})") from err
    try:
        nodes, arrays = document["nodes"], document["b64ndarrays"]
        table = nodes[document["root"]]
        if table.get("type_key") != "Map" or table.get("keys") != ["relay.Constant"]:
            raise ValueError("holds something other than constants")
        listed = nodes[table["data"][0]]
        if listed.get("type_key") != "Array" or len(listed["data"]) > MAX_CONSTANTS:
            raise ValueError("holds no list of constants")
        indices = []
        for index in listed["data"]:
            node = nodes[index]
            if node.get("type_key") != "relay.Constant":
                raise ValueError(f"lists a {str(node.get('type_key'))[:40]!r} among its constants")
            indices.append(int(node["attrs"]["data"]))
        budget = [MAX_CONSTANT_BYTES]
        decoded = [_ndarray(base64.b64decode(arrays[i], validate=True), budget) for i in indices]
    except (KeyError, IndexError, TypeError, AttributeError, RecursionError) as err:
        raise ValueError(f"is not what astext writes ({type(err).__name__})") from err
    except binascii.Error as err:
        raise ValueError("holds an array that is not base64") from err
    return {"relay.Constant": [relay.const(array) for array in decoded]}


#: DLPack type codes (int, uint, float) and the numpy kind of each.
_KINDS = {0: "int", 1: "uint", 2: "float"}


def _ndarray(blob: bytes, budget: list[int]) -> np.ndarray[Any, Any]:
    """One array in TVM's saved layout, every size checked against the bytes there are (and
    against ``budget``, the bytes all arrays may still take) before anything is allocated."""
    reader = _Layout(blob)
    if reader.number("<Q") != _ARRAY_MAGIC:
        raise ValueError("holds an array without its magic number")
    reader.number("<Q")
    device_type, _ = struct.unpack("<ii", reader.take(8))
    ndim = reader.number("<i")
    code, bits, lanes = struct.unpack("<BBH", reader.take(4))
    kind = _KINDS.get(code)
    if device_type != 1 or not 0 <= ndim <= 32 or kind is None or lanes != 1:
        raise ValueError("holds an array that is not a CPU tensor of a plain dtype")
    dtype = np.dtype("bool" if (kind, bits) == ("uint", 1) else f"{kind}{bits}")
    shape = struct.unpack(f"<{ndim}q", reader.take(8 * ndim))
    if any(dim < 0 for dim in shape):
        raise ValueError("holds an array with a negative dimension")
    size = reader.number("<q")
    if size != math.prod(shape) * dtype.itemsize or size > budget[0]:
        raise ValueError(f"holds an array that claims {size} bytes for its shape")
    budget[0] -= size
    return np.frombuffer(reader.take(size), dtype=dtype).reshape(shape).copy()


class _Layout:
    """Reads TVM's saved layout from the front, refusing a size that overruns the bytes."""

    def __init__(self, blob: bytes) -> None:
        self.blob, self.position = blob, 0

    def take(self, size: int) -> bytes:
        if not 0 <= size <= len(self.blob) - self.position:
            at = self.position
            raise ValueError(f"it claims {size} bytes at byte {at} of {len(self.blob)}")
        self.position += size
        return self.blob[self.position - size : self.position]

    def number(self, fmt: str) -> int:
        value: int = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value


#: A C identifier: what a function's symbol becomes in the code a build generates.
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}\Z")


def refuse_external_code(path: Path, func: relay.Function) -> None:
    """A model file describes TVM's own computation: a function for an external compiler
    (``Compiler``) is handed to that compiler's code generator, which pastes the function's
    symbol into C source that exporting the library compiles; and any symbol must be a C
    identifier."""
    attrs = func.attrs or {}
    if "Compiler" in attrs:
        raise ModelError(
            f"{path}: a function for the external compiler {str(attrs['Compiler'])!r}: "
            "relay-tasks reads only functions TVM itself compiles from a model file"
        )
    for key in ("global_symbol", "ExternalSymbol"):
        if key in attrs and not _SYMBOL.match(str(attrs[key])):
            raise ModelError(f"{path}: the {key} {str(attrs[key])[:60]!r} is not an identifier")


def _functions(mod: IRModule) -> list[relay.Function]:
    """Every Relay function of ``mod``, nested ones (closures, fused regions) included."""
    found: list[relay.Function] = []
    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(
                func, lambda node: found.append(node) if isinstance(node, relay.Function) else None
            )
    return found


def load_params(path: Path) -> Params:
    """Read a params file written by ``relay.save_param_dict``."""
    try:
        blob = path.read_bytes()
    except OSError as err:
        raise ModelError(f"{path}: cannot read the params file ({err})") from err
    return read_params(blob, path)


def read_params(blob: bytes, path: Path) -> Params:
    """The arrays of a params file's bytes, every size checked before TVM's reader runs."""
    try:
        check_params_layout(blob)
        return dict(relay.load_param_dict(bytearray(blob)))
    except (tvm.TVMError, ValueError) as err:
        why = f" ({err})" if isinstance(err, ValueError) else ""
        raise ModelError(
            f"{path}: not a params file written by relay.save_param_dict{why}"
        ) from err


_LIST_MAGIC, _ARRAY_MAGIC = 0xF7E58D4F05049CB7, 0xDD5E40F096B4A13F


def check_params_layout(blob: bytes) -> None:
    """Walk TVM's params layout (names, then per array: magic, device, ndim, dtype, shape,
    byte size, data), checking every count and size against the bytes that are left before
    TVM's reader allocates what the header claims (a 97-byte file can claim gigabytes);
    ``ValueError`` says what does not fit."""
    layout = _Layout(blob)
    take, number = layout.take, layout.number

    if number("<Q") != _LIST_MAGIC:
        raise ValueError("it does not start with the params magic number")
    number("<Q")
    names = number("<Q")
    for _ in range(min(names, len(blob))):
        take(number("<Q"))
    if number("<Q") != names:
        raise ValueError("it names a different number of arrays than it holds")
    for _ in range(names):
        if number("<Q") != _ARRAY_MAGIC:
            raise ValueError(f"array at byte {layout.position - 8} has no array magic number")
        number("<Q")
        device_type, _ = struct.unpack("<ii", take(8))
        ndim = number("<i")
        code, bits, lanes = struct.unpack("<BBH", take(4))
        if device_type != 1 or not 0 <= ndim <= 32 or code not in (0, 1, 2, 4) or lanes != 1:
            raise ValueError(
                f"array at byte {layout.position} is not a CPU tensor of a plain dtype"
            )
        shape = struct.unpack(f"<{ndim}q", take(8 * ndim))
        elements = 1
        for dim in shape:
            if dim < 0:
                raise ValueError(f"array at byte {layout.position} has a negative dimension")
            elements *= dim
        size = number("<q")
        if size != elements * ((bits + 7) // 8):
            raise ValueError(f"array at byte {layout.position} claims {size} bytes for its shape")
        take(size)


#: How ``main``'s parameters are named in a packed model's text: frontends name them
#: anything (``aten::linear_0.bias``), which Relay text cannot spell.
_PARAMETER = "relay_tasks_parameter_"
#: What a parameter's name may be (a name the user gives shapes by, and params are keyed by).
_PARAMETER_NAME = re.compile(r"[ -~]{1,256}\Z")


def pack_model(mod: IRModule, params: Params) -> list[bytes | memoryview]:
    """A converted model as data: its Relay text, the names of ``main``'s parameters, and the
    arrays (params, and the tensor constants of ``main``) as raw bytes, which
    :func:`unpack_model` reads back into an equal module.

    The tensor constants of ``main`` (a frozen ONNX model's weights) travel as arrays of new
    parameters, one per distinct constant, so a constant used twice comes back one object:
    TVM's printer writes 100 MB of weights as base64 in 3.4 s, and its params format takes
    0.7 s to write and read them. Scalars are written inline; constants elsewhere (rare) go
    into the text's metadata, which :func:`read_metadata` reads.
    """
    main, constants = _lift_constants(mod["main"])
    named = [relay.var(f"{_PARAMETER}{i}", p.type_annotation) for i, p in enumerate(main.params)]
    body = relay.bind(main.body, dict(zip(main.params, named, strict=True)))
    packed = IRModule(mod.functions, mod.type_definitions)
    packed["main"] = relay.Function(named, body, main.ret_type, main.type_params, main.attrs)
    text: bytes = packed.astext().encode()
    lifted = {i: constants[node_key(p)] for i, p in enumerate(main.params)
              if node_key(p) in constants}  # fmt: skip
    arrays: list[tuple[str | int, Any]] = [(n, _array_view(v)) for n, v in params.items()]
    arrays += [(position, _array_view(value)) for position, value in lifted.items()]
    header = json.dumps({
        "text": len(text),
        "names": [None if i in lifted else p.name_hint for i, p in enumerate(main.params)],
        "typed": _typed(mod["main"]),
        "annotated": mod["main"].ret_type is not None,  # the printer writes a type it inferred
        "arrays": [[key, str(a.dtype), list(a.shape), a.nbytes] for key, a in arrays],
    }).encode()  # fmt: skip
    pieces: list[bytes | memoryview] = [struct.pack("<Q", len(header)), header, text]
    return pieces + [np.ascontiguousarray(a).data.cast("B") for _, a in arrays]


def _typed(func: relay.Function) -> bool:
    try:
        func.checked_type  # noqa: B018 (raises when type inference never ran on it)
    except ValueError:
        return False
    return True


def _array_view(value: Any) -> np.ndarray[Any, Any]:
    try:
        return np.from_dlpack(value)
    except (RuntimeError, TypeError, BufferError):
        return np.asarray(value.numpy())  # dtypes DLPack does not carry (bool)


#: The dtypes a packed array may have.
_PACKED_DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)  # fmt: skip


def unpack_model(data: memoryview, path: Path) -> tuple[IRModule, Params]:
    """:func:`pack_model`'s bytes, every size checked against the bytes there are before
    anything is allocated; the text read as a Relay text file is read."""
    try:
        (size,) = struct.unpack_from("<Q", data)
        header = json.loads(bytes(data[8 : 8 + size]))
        position = 8 + size + int(header["text"])
        text = bytes(data[8 + size : position]).decode()
        names = list(header["names"])
        if not all(n is None or (isinstance(n, str) and _PARAMETER_NAME.match(n)) for n in names):
            raise ValueError("a parameter name that is no short line of plain text")
        params: dict[str, tvm.nd.NDArray] = {}
        lifted: dict[int, tvm.nd.NDArray] = {}
        for key, dtype, shape, nbytes in header["arrays"]:
            kind = np.dtype(dtype) if dtype in _PACKED_DTYPES else None
            dims = [int(d) for d in shape]
            if (
                kind is None
                or min(dims, default=0) < 0
                or math.prod(dims) * kind.itemsize != nbytes
            ):
                raise ValueError(f"an array {str(key)[:40]!r} of {dtype} {shape} in {nbytes} bytes")
            if not 0 <= nbytes <= len(data) - position:
                raise ValueError(f"an array {str(key)[:40]!r} past the end of the data")
            chunk = np.frombuffer(data[position : position + nbytes], dtype=kind)
            value = tvm.nd.array(chunk.reshape(dims))
            position += nbytes
            if type(key) is int and 0 <= key < len(names) and names[key] is None:
                lifted[key] = value
            elif isinstance(key, str) and _PARAMETER_NAME.match(key):
                params[key] = value
            else:
                raise ValueError(f"an array for {str(key)[:40]!r}, which is no parameter")
        if position != len(data) or len(lifted) != names.count(None):
            raise ValueError("other arrays than its parameters name")
    except (ValueError, TypeError, KeyError, struct.error, UnicodeDecodeError) as err:
        raise ModelError(f"{path}: its conversion is not a packed model ({err})") from err
    mod = parse_relay_text(text, path)
    main = mod["main"]
    if [p.name_hint for p in main.params] != [f"{_PARAMETER}{i}" for i in range(len(names))]:
        raise ModelError(f"{path}: its conversion's parameters are not the ones it names")
    bound = {
        var: relay.Constant(lifted[i]) if name is None else relay.var(name, var.type_annotation)
        for i, (var, name) in enumerate(zip(main.params, names, strict=True))
    }
    kept = [bound[var] for var, name in zip(main.params, names, strict=True) if name is not None]
    returns = main.ret_type if header.get("annotated") is True else None
    body = relay.bind(main.body, bound)
    mod["main"] = relay.Function(kept, body, returns, main.type_params, main.attrs)
    if header.get("typed") is not True:
        return mod, params  # as the converter left it: typed where it is used
    with diagnostics() as messages:
        try:
            return relay.transform.InferType()(mod), params
        except tvm.TVMError as err:
            raise ModelError(f"{path}: its conversion does not type-check: "
                             f"{diagnostic_text(messages, err)}") from err  # fmt: skip


def _lift_constants(main: relay.Function) -> tuple[relay.Function, dict[int, Any]]:
    """``main`` with each distinct tensor constant (not a scalar) replaced by a new parameter
    at the end, and each such parameter's array by its node key; ``main`` as it is
    where a node kind cannot be rebuilt (its constants then go to the text's metadata)."""
    reads = reads_of(main)
    memo: dict[int, Any] = {}
    by_constant: dict[int, relay.Var] = {}
    arrays: dict[int, Any] = {}

    def get(node: Any) -> Any:
        return memo.get(node_key(node), node)

    for node in reads.nodes:
        if isinstance(node, relay.Constant) and len(raw_data(node).shape) > 0:
            key = node_key(node)
            if key not in by_constant:
                data = raw_data(node)
                var = relay.var("constant", shape=data.shape, dtype=data.dtype)
                by_constant[key] = var
                arrays[node_key(var)] = data
            memo[key] = by_constant[key]
        else:
            new = rebuild(node, get)
            if new is None:
                return main, {}
            memo[node_key(node)] = new
    body = memo[node_key(main)].body
    params = [*main.params, *by_constant.values()]
    return relay.Function(params, body, main.ret_type, main.type_params, main.attrs), arrays


def with_input_types(path: Path, mod: IRModule, shapes: Shapes, dtypes: DTypes) -> IRModule:
    """``main`` with the named inputs retyped (``--input-shapes``), e.g. another batch size.

    Only inputs are retyped; whether the rest of the model fits is the type checker's to say.
    """
    main = mod["main"]
    names = [p.name_hint for p in main.params]
    unknown_inputs(path, [*shapes, *dtypes], names)
    retyped = {}
    for param in main.params:
        name = param.name_hint
        if name in shapes or name in dtypes:
            old = param.checked_type if param.type_annotation is None else param.type_annotation
            shape = shapes.get(name, [int(d) for d in old.shape])
            retyped[param] = relay.var(name, shape=shape, dtype=dtypes.get(name, old.dtype))
    params = [retyped.get(p, p) for p in main.params]
    body = relay.bind(main.body, dict(retyped.items()))
    func = relay.Function(params, body, None, main.type_params, main.attrs)
    result = IRModule(mod.functions, mod.type_definitions)
    result["main"] = func
    with diagnostics() as messages:
        try:
            return relay.transform.InferType()(result)
        except tvm.TVMError as err:
            raise ModelError(f"{path}: the model does not type-check with these input shapes: "
                             f"{diagnostic_text(messages, err)}") from err  # fmt: skip
