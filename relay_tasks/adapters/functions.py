"""Primitive functions as plain data: what a task file carries, and the only way one is read.

A task file names *what* to tune by the Relay primitive function its task was lowered from;
``tune``, ``status`` and ``compile`` lower it again here, so what gets compiled is derived on
this machine, never taken from the file. The function travels as a flat table of plain values
(op names, attribute values, shapes), never as TVM's object JSON: that format lets a file put
any registered object in any field, so a reader would have to trust it to be well typed. This
reader builds every node through TVM's typed constructors instead, from an allowlist:

- nodes: parameters, calls of Relay operators lowering computes (with exactly the attributes
  type the operator declares), tuples, tuple items, ``let``, constants; one function,
  ``Primitive``;
- attribute values: numbers, strings, ``None`` and lists of them; dimensions as integers;
- names (parameters, constants): identifiers;
- bounds: nodes, nesting depth, dimensions, tensor sizes, checked before anything is built.

Each entry refers to earlier entries only, so the depth is counted in one pass and no cycle
can be written.
"""

from __future__ import annotations

import base64
import functools
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relay

from ..errors import ModelError, describe_failure
from ..lowering.extract import typed_function
from .base import TunerTask

#: A fused function has at most a few hundred calls (TVM's FuseOps stops at 256 ops deep).
MAX_NODES = 20_000
MAX_DEPTH = 1_024
#: Per dimension and per tensor: above every real model's, far below what would exhaust memory
#: when a tuner enumerates a dimension's factors or a compute's iterations.
MAX_DIM = 2**24
MAX_ELEMENTS = 2**32
MAX_CONSTANT_BYTES = 2**30
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,199}\Z")
_DTYPE = re.compile(r"(bool|u?int(8|16|32|64)|float(16|32|64)|bfloat16)\Z")
#: Function attributes TVM's own FuseOps gives a primitive function (all integer flags).
FUNCTION_ATTRS = frozenset({"Primitive", "relay.reshape_only"})


def function_data(func: relay.Function) -> list[Any]:
    """``func`` as a table of plain values (see the module's docstring), root last."""
    table: list[Any] = []
    index: dict[Any, int] = {}

    def add(node: Any, entry: list[Any]) -> None:
        index[node] = len(table)
        table.append(entry)

    for param in func.params:
        add(param, ["var", param.name_hint, _type_data(param.type_annotation)])
    for node in _post_order(func.body):
        if node in index:
            continue
        if isinstance(node, relay.Var):
            add(node, ["var", node.name_hint, _type_data(node.type_annotation)])
        elif isinstance(node, relay.Constant):
            add(node, _constant_data(node.data))
        elif isinstance(node, relay.Call):
            if not isinstance(node.op, tvm.ir.Op):
                raise ValueError("a primitive function calls operators only")
            args = [index[arg] for arg in node.args]
            add(node, ["call", node.op.name, args, _attrs_data(node.attrs)])
        elif isinstance(node, relay.Tuple):
            add(node, ["tuple", [index[field] for field in node.fields]])
        elif isinstance(node, relay.TupleGetItem):
            add(node, ["item", index[node.tuple_value], int(node.index)])
        elif isinstance(node, relay.Let):
            add(node, ["let", index[node.var], index[node.value], index[node.body]])
        else:
            raise ValueError(f"a primitive function holds no {type(node).__name__}")
    attrs = {name: int(value) for name, value in (func.attrs or {}).items()}
    if not set(attrs) <= FUNCTION_ATTRS:
        raise ValueError(f"a function with attributes {sorted(attrs)} is not TVM's to tune")
    table.append(["function", [index[p] for p in func.params], index[func.body], attrs])
    return table


def _post_order(body: relay.Expr) -> list[Any]:
    """Every node under ``body``, each after the nodes it refers to (iteratively: a deep
    function must not exhaust Python's stack)."""
    order: list[Any] = []
    seen: set[Any] = set()
    stack: list[tuple[Any, bool]] = [(body, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(_children(node)))
    return order


def _children(node: Any) -> list[Any]:
    if isinstance(node, relay.Call):
        return list(node.args)
    if isinstance(node, relay.Tuple):
        return list(node.fields)
    if isinstance(node, relay.TupleGetItem):
        return [node.tuple_value]
    if isinstance(node, relay.Let):
        return [node.var, node.value, node.body]
    return []


def _type_data(ttype: Any) -> list[Any]:
    if isinstance(ttype, relay.TensorType):
        return ["tensor", [_value_data(d) for d in ttype.shape], ttype.dtype]
    if isinstance(ttype, relay.TupleType):
        return ["tuple", [_type_data(f) for f in ttype.fields]]
    raise ValueError(f"a primitive function's parameters have no {type(ttype).__name__}")


def _constant_data(data: tvm.nd.NDArray) -> list[Any]:
    array = data.numpy()
    text = base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()
    return ["constant", str(array.dtype), list(array.shape), text]


def _attrs_data(attrs: Any) -> Any:
    if attrs is None:
        return None
    names = attrs.keys()  # an Attrs object is no mapping: iterating it fails
    fields = {str(name): _value_data(attrs[name]) for name in names}
    return [str(attrs.type_key), fields]


def _value_data(value: Any) -> Any:
    """An attribute value or dimension: Python values as they are, TIR numbers tagged with
    their dtype (an int64 stride is not an int32 one), lists for arrays."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tvm.tir.IntImm):
        return ["int", value.dtype, int(value.value)]
    if isinstance(value, tvm.tir.FloatImm):
        return ["float", value.dtype, float(value.value)]
    if isinstance(value, tvm.tir.Any):
        return ["any"]
    if isinstance(value, tvm.runtime.container.String):
        return str(value)
    if isinstance(value, tvm.ir.container.Array):
        return ["array", [_value_data(v) for v in value]]
    raise ValueError(f"an attribute value of type {type(value).__name__} is not plain data")


class _Reader:
    """Builds a function from its table, checking each entry before building anything."""

    def __init__(self, table: Any) -> None:
        if not isinstance(table, list) or not table:
            raise ValueError("the function is not a list of nodes")
        if len(table) > MAX_NODES:
            raise ValueError(f"the function has {len(table)} nodes (at most {MAX_NODES})")
        self.table = table
        self.nodes: list[Any] = []
        self.depths: list[int] = []

    def read(self) -> relay.Function:
        builders: dict[str, Callable[[list[Any]], Any]] = {
            "var": self._var,
            "constant": self._constant,
            "call": self._call,
            "tuple": lambda e: relay.Tuple([self._ref(i) for i in _list(e[1])]),
            "item": lambda e: relay.TupleGetItem(self._ref(e[1]), _int(e[2], 0, 2**16)),
            "let": self._let,
        }
        for position, entry in enumerate(self.table[:-1]):
            if not isinstance(entry, list) or not entry or entry[0] not in builders:
                raise ValueError(f"node {position} is not a node of a primitive function")
            refs = _refs(entry)
            depth = 1 + max((self._depth(r, position) for r in refs), default=0)
            if depth > MAX_DEPTH:
                raise ValueError(f"the function nests deeper than {MAX_DEPTH} nodes")
            self.nodes.append(builders[entry[0]](entry))
            self.depths.append(depth)
        last = self.table[-1]
        if not isinstance(last, list) or len(last) != 4 or last[0] != "function":
            raise ValueError("the last node is not the function")
        params = [self._ref(i) for i in _list(last[1])]
        if not all(isinstance(p, relay.Var) for p in params):
            raise ValueError("a function parameter is not a variable")
        attrs = last[3]
        if not isinstance(attrs, dict) or attrs.get("Primitive") != 1:
            raise ValueError('the function is not marked "Primitive"')
        if not set(attrs) <= FUNCTION_ATTRS or any(v not in (0, 1) for v in attrs.values()):
            raise ValueError(f"function attributes {sorted(attrs)} are not FuseOps' flags")
        return relay.Function(params, self._ref(last[2])).with_attr(attrs)

    def _depth(self, ref: Any, position: int) -> int:
        if type(ref) is not int or not 0 <= ref < position:
            raise ValueError(f"node {position} refers to {ref!r}, which is not an earlier node")
        return self.depths[ref]

    def _ref(self, ref: Any) -> Any:
        if type(ref) is not int or not 0 <= ref < len(self.nodes):
            raise ValueError(f"a reference to {ref!r}, which is not an earlier node")
        return self.nodes[ref]

    def _var(self, entry: list[Any]) -> relay.Var:
        _arity(entry, 3)
        return relay.var(_name(entry[1]), type_annotation=read_type(entry[2]))

    def _constant(self, entry: list[Any]) -> relay.Constant:
        _arity(entry, 4)
        dtype, shape = read_dtype(entry[1]), read_shape(entry[2])
        if not isinstance(entry[3], str) or len(entry[3]) > MAX_CONSTANT_BYTES * 4 // 3 + 4:
            raise ValueError("a constant's data is not base64 text of a bounded size")
        raw = base64.b64decode(entry[3], validate=True)
        array = np.frombuffer(raw, dtype=dtype)
        if array.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"a constant's data does not have its shape {shape}")
        return relay.const(array.reshape(shape))

    def _call(self, entry: list[Any]) -> relay.Call:
        _arity(entry, 4)
        name = entry[1]
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{name!r} is not an operator name")
        if name not in _registered_ops():
            raise ValueError(f"{name!r} is not a Relay operator lowering computes")
        op = tvm.ir.Op.get(name)
        args = [self._ref(i) for i in _list(entry[2])]
        return relay.Call(op, args, _attrs(op, entry[3]))

    def _let(self, entry: list[Any]) -> relay.Let:
        _arity(entry, 4)
        var = self._ref(entry[1])
        if not isinstance(var, relay.Var):
            raise ValueError("a let binds something that is not a variable")
        return relay.Let(var, self._ref(entry[2]), self._ref(entry[3]))


def read_function(table: Any) -> relay.Function:
    """The primitive function of a task file, built from its table; ``ValueError`` says what is
    wrong with a table this module would not have written."""
    return _Reader(table).read()


def _refs(entry: list[Any]) -> list[Any]:
    kind = entry[0]
    if kind == "call" and len(entry) > 2:
        return _list(entry[2])
    if kind == "tuple" and len(entry) > 1:
        return _list(entry[1])
    if kind == "item" and len(entry) > 1:
        return [entry[1]]
    if kind == "let":
        return entry[1:4]
    return []


def _arity(entry: list[Any], size: int) -> None:
    if len(entry) != size:
        raise ValueError(f"a {entry[0]} node has {len(entry)} fields, not {size}")


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{value!r} is not a list")
    return value


def _int(value: Any, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{value!r} is not an integer from {low} to {high}")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(f"{value!r} is not a name (letters, digits, _ and .)")
    return value


def read_dtype(value: Any) -> str:
    """A tensor dtype TVM's tensors have (no other text reaches a type)."""
    if not isinstance(value, str) or not _DTYPE.match(value):
        raise ValueError(f"{value!r} is not a tensor dtype")
    return value


def read_shape(value: Any) -> list[int]:
    """A static shape within the bounds of the module's docstring."""
    shape = [_int(d, 0, MAX_DIM) for d in _list(value)]
    if len(shape) > 8 or int(np.prod(shape, dtype=np.float64)) > MAX_ELEMENTS:
        raise ValueError(f"the shape {shape} is larger than a task's tensor can be")
    return shape


def read_type(value: Any) -> Any:
    """A parameter's type: a tensor type (dimensions checked) or a tuple of types."""
    kind = _list(value)[:1]
    if kind == ["tensor"] and len(value) == 3:
        dims = [_dim(d) for d in _list(value[1])]
        static = [int(d) for d in dims if isinstance(d, tvm.tir.IntImm)]
        read_shape(static)
        return relay.TensorType(dims, read_dtype(value[2]))
    if kind == ["tuple"] and len(value) == 2:
        return relay.TupleType([read_type(f) for f in _list(value[1])])
    raise ValueError(f"{value!r} is not a tensor or tuple type")


def _dim(value: Any) -> Any:
    if value == ["any"]:
        return relay.Any()
    dim = _prim(value)
    if not isinstance(dim, tvm.tir.IntImm):
        raise ValueError(f"{value!r} is not a dimension")
    _int(int(dim), 0, MAX_DIM)
    return dim


def _prim(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 3 and value[0] in ("int", "float"):
        kind, dtype, number = value[0], read_dtype(value[1]), value[2]
        if kind == "int" and type(number) is int and _fits(number, dtype):
            return tvm.tir.IntImm(dtype, number)
        if kind == "float" and dtype.startswith(("float", "bfloat")) and type(number) is float:
            return tvm.tir.FloatImm(dtype, number)
    raise ValueError(f"{value!r} is not a number of its dtype")


def _fits(number: int, dtype: str) -> bool:
    if dtype == "bool":
        return number in (0, 1)
    if not dtype.startswith(("int", "uint")):
        return False
    bits = int(dtype.lstrip("uint"))
    if dtype.startswith("u"):
        return 0 <= number < 1 << bits
    return -(1 << (bits - 1)) <= number < 1 << (bits - 1)


def _plain(value: Any, depth: int = 0) -> Any:
    """An attribute value back as what TVM's attribute constructors take."""
    if depth > 8:
        raise ValueError("an attribute value nests too deeply")
    if value is None or type(value) in (bool, int, float):
        return value
    if isinstance(value, str):
        if len(value) > 200:
            raise ValueError("an attribute string is longer than any operator's")
        return value
    if isinstance(value, list) and value[:1] == ["array"] and len(value) == 2:
        return [_plain(v, depth + 1) for v in _list(value[1])]
    if value == ["any"]:
        return relay.Any()
    return _prim(value)


def _attrs(op: tvm.ir.Op, data: Any) -> Any:
    declared = str(op.attrs_type_key or "")
    if data is None and not declared:
        return None
    if not isinstance(data, list) or len(data) != 2 or not isinstance(data[1], dict):
        raise ValueError(f"the attributes of {op.name} are not [type, fields]")
    if not declared or data[0] != declared:
        raise ValueError(
            f"{op.name} takes attributes of type {declared or 'none'}, not {data[0]!r}"
        )
    fields = {_name(name): _plain(value) for name, value in data[1].items()}
    try:
        return tvm.ir.make_node(declared, **fields)
    except Exception as err:  # TVM's constructor checks each field's type and name
        # An unknown field's error goes on to list every field: its first line says it all.
        named = [line.strip() for line in str(err).splitlines() if "does not have field" in line]
        why = named[0].split(", Possible")[0] if named else describe_failure(err)
        raise ValueError(f"the attributes of {op.name} cannot be built ({why})") from None


_OPS: set[str] = set()
#: Registered with a compute, yet never inside a primitive function: the passes before FuseOps
#: remove annotations, lowering refuses device copies, and ``debug`` calls back into Python.
_NEVER_FUSED = ("annotation.", "debug", "device_copy")


def _registered_ops() -> set[str]:
    """Relay operators lowering can compute: a fusion pattern and a strategy or compute (TIR's
    own operators share the registry, and calling one from Relay crashes type inference)."""
    if not _OPS:
        for name in map(str, tvm.ir.Op.list_op_names()):
            op = tvm.ir.Op.get(name)
            computed = op.get_attr("FTVMStrategy") or op.get_attr("FTVMCompute")
            fused = op.get_attr("TOpPattern") is not None and not name.startswith(_NEVER_FUSED)
            if computed and fused:
                _OPS.add(name)
    return _OPS


def source_data(task: TunerTask) -> dict[str, Any]:
    """The part of a task's payload every tuner shares: its primitive function and the names of
    its tensor constants."""
    source = task.source
    if source is None:
        raise ModelError(
            f"task {task.name} has no primitive function to write (it was not made by extraction)"
        )
    names = [tensor.op.name for tensor, _ in source.lowered.constants]
    return {"function": function_data(source.func), "constants": names}


def read_source(
    payload: dict[str, Any], *, also: frozenset[str] = frozenset()
) -> tuple[relay.Function, list[str]]:
    """The function and constant names :func:`source_data` wrote, read and checked; the
    payload may hold nothing else but the tuner's own fields ``also``."""
    only_fields(payload, {"function", "constants"} | also)
    names = [_name(n) for n in _list(payload.get("constants"))]
    func = typed_function(read_function(payload.get("function")))
    relay.analysis.post_order_visit(func, _check_types)
    return func, names


#: Ways to tile one dimension into four ordered factors, at most: tuners enumerate them for
#: each axis they split (AutoTVM's split spaces, every one), and a dimension with many small
#: prime factors has hundreds of thousands below 2^24. Real models' dimensions have far fewer
#: (4,096: 455; 3,072: 1,144; 100,352 = 7·7·2,048: 3,640).
MAX_TILINGS = 100_000


def _check_types(node: Any) -> None:
    """Every tensor a typed function computes (its operators' attributes make shapes too, as
    ``full`` or ``reshape`` do) within the bounds its parameters' types are held to."""
    if isinstance(node, relay.Expr) and not isinstance(node, (relay.Function, tvm.ir.Op)):
        _check_type(node.checked_type)


def _check_type(kind: Any) -> None:
    if isinstance(kind, relay.TupleType):
        for field in kind.fields:
            _check_type(field)
    elif isinstance(kind, relay.TensorType):
        static = [int(d) for d in kind.shape if isinstance(d, tvm.tir.IntImm)]
        read_shape(static)
        for dim in static:
            if tilings(dim) > MAX_TILINGS:
                count = f"{tilings(dim):,} tilings, more than the {MAX_TILINGS:,}"
                raise ValueError(f"its dimension {dim} has {count} any real model's has")


@functools.cache
def tilings(n: int) -> int:
    """The ordered ways to write ``n`` as a product of four factors: for each prime power
    p^e in ``n``, the ways to spread e over four factors, C(e + 3, 3)."""
    count, prime = 1, 2
    while prime * prime <= n:
        exponent = 0
        while n % prime == 0:
            n, exponent = n // prime, exponent + 1
        count *= math.comb(exponent + 3, 3)
        prime += 1
    return count * (4 if n > 1 else 1)


def only_fields(payload: dict[str, Any], allowed: set[str]) -> None:
    """Refuse a payload with fields this format has no place for (an older format's compiled
    forms among them): nothing in a file is read that is not on the list."""
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise ValueError(f"its payload holds {', '.join(map(repr, unknown))}, which it may not")
