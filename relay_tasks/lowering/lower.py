"""Lower one primitive function to TE compute: the only lowering extraction needs.

This is the Python counterpart of upstream's ``LowerToTECompute`` visitor: placeholders for the
parameters, each operator call turned into TE by the op strategy's *compute* (chosen by
``relay.backend.lower_call``, so AutoTVM tracing and plevel selection behave exactly as upstream),
scalar constants inlined and tensor constants made placeholders. No schedule is created or applied,
so an operator whose TE schedule is broken or missing for the target still yields its task.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import tvm
from tvm import relay, te, tir
from tvm.relay.backend import te_compiler
from tvm.target import Target

from ..errors import ExtractionError
from ..ir import node_key
from .cxx import std_hash_string

#: Upstream shortens longer fused names to this many characters plus a hash.
MAX_FUNC_NAME_LENGTH = 80

_QNN_ANCHORS = ("qnn.conv2d", "qnn.dense", "qnn.contrib_dense_pack")
# Sequences (anchor first) that upstream lowers as one TOPI call at the trailing requantize.
_QNN_PATTERNS = (
    ("qnn.dense", "add", "qnn.requantize"),
    ("qnn.dense", "qnn.requantize"),
    ("qnn.contrib_dense_pack", "add", "qnn.requantize"),
    ("qnn.contrib_dense_pack", "qnn.requantize"),
    ("qnn.conv2d", "add", "qnn.requantize"),
    ("qnn.conv2d", "qnn.requantize"),
)
_QNN_MEMBERS = frozenset((*_QNN_ANCHORS, "add", "qnn.requantize"))


@dataclass(frozen=True, eq=False)
class LoweredTE:
    """The TE compute of one primitive function, as upstream's lowering produces it.

    ``outputs`` are the function's results as the op computes return them (a result that is just
    an input stays a placeholder); ``constants`` pairs each tensor constant's placeholder with its
    data, in the order they become extra PrimFunc arguments.
    """

    fused_name: str
    inputs: tuple[te.Tensor, ...]
    outputs: tuple[te.Tensor, ...]
    constants: tuple[tuple[te.Tensor, tvm.nd.NDArray], ...]
    constant_bases: tuple[str, ...]
    anchor_op: str

    def tir_args(self) -> list[te.Tensor]:
        """Inputs, computed outputs and constant placeholders: a TIR converter's arguments."""
        computed = [t for t in self.outputs if not isinstance(t.op, te.PlaceholderOp)]
        return [*self.inputs, *computed, *(tensor for tensor, _ in self.constants)]


def fused_function_name(readable: str) -> str:
    """Shorten a long fused name the way upstream does (prefix, then ``_<std::hash hex>_``)."""
    if len(readable) <= MAX_FUNC_NAME_LENGTH:
        return readable
    return f"{readable[:MAX_FUNC_NAME_LENGTH]}_{std_hash_string(readable):x}_"


class ConstantNames(Protocol):
    """Where tensor constants get their names: TVM's ``NameSupply`` (shared by one
    extraction), or the names a task file recorded."""

    def fresh_name(self, base: str) -> str: ...


def lower_to_te(func: relay.Function, target: Target, constant_names: ConstantNames) -> LoweredTE:
    """Lower a primitive function to TE compute for ``target``.

    Must run inside ``with target`` and the extraction's ``PassContext``: strategies read both.
    ``constant_names`` is shared across the functions of one extraction, as upstream shares it.
    """
    return _TELowering(target, constant_names).lower(func)


class _TELowering:
    def __init__(self, target: Target, constant_names: ConstantNames) -> None:
        self.target = target
        self.constant_names = constant_names
        self.memo: dict[int, list[te.Tensor]] = {}
        self.keep_alive: list[relay.Expr] = []
        self.readable = "fused"
        self.constants: list[tuple[te.Tensor, tvm.nd.NDArray]] = []
        self.constant_bases: list[str] = []
        self.qnn_registered: list[str] = []
        self.qnn_anchor: relay.Call | None = None
        self.anchor_op = ""
        self.anchor_pattern = -1

    def lower(self, func: relay.Function) -> LoweredTE:
        inputs: list[te.Tensor] = []
        for param in func.params:
            tensors = []
            for ttype in flatten_tuple_type(param.checked_type):
                name = param.name_hint or "placeholder"
                tensors.append(te.placeholder(te_shape(ttype.shape), ttype.dtype, name))
            inputs.extend(tensors)
            self._remember(param, tensors)
        outputs = self.visit(func.body)
        return LoweredTE(
            fused_name=fused_function_name(self.readable),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            constants=tuple(self.constants),
            constant_bases=tuple(self.constant_bases),
            anchor_op=self.anchor_op,
        )

    def _remember(self, expr: relay.Expr, tensors: list[te.Tensor]) -> None:
        self.keep_alive.append(expr)
        self.memo[node_key(expr)] = tensors

    def visit(self, expr: relay.Expr) -> list[te.Tensor]:
        known = self.memo.get(node_key(expr))
        if known is not None:
            return known
        if isinstance(expr, relay.Constant):
            result = self._constant(expr)
        elif isinstance(expr, relay.Call):
            result = self._call(expr)
        elif isinstance(expr, relay.Tuple):
            result = [self._single(field) for field in expr.fields]
        elif isinstance(expr, relay.TupleGetItem):
            result = [self.visit(expr.tuple_value)[expr.index]]
        elif isinstance(expr, relay.Let):
            self._remember(expr.var, self.visit(expr.value))
            result = self.visit(expr.body)
        elif isinstance(expr, relay.Var):
            raise ExtractionError(f"free variable {expr.name_hint!r} inside a primitive function")
        else:
            raise ExtractionError(
                f"a primitive function contains a {type(expr).__name__}, which cannot be lowered"
            )
        self._remember(expr, result)
        return result

    def _single(self, field: relay.Expr) -> te.Tensor:
        if not isinstance(field.checked_type, relay.TensorType):
            raise ExtractionError("only tuples of tensors can be lowered in a primitive function")
        tensors = self.visit(field)
        return tensors[0]

    def _constant(self, const: relay.Constant) -> list[te.Tensor]:
        data = const.data
        if len(data.shape) == 0:
            value = _scalar_imm(data)
            tensor = te.compute((), lambda: value, "compile_engine_const", tag="broadcast")
            return [tensor]
        ttype = const.checked_type
        base = self.readable.replace(".", "_") + "_constant"
        self.constant_bases.append(base)
        name = self.constant_names.fresh_name(base)
        tensor = te.placeholder(te_shape(ttype.shape), ttype.dtype, name)
        self.constants.append((tensor, data))
        return [tensor]

    def _call(self, call: relay.Call) -> list[te.Tensor]:
        op = call.op
        if not isinstance(op, tvm.ir.Op):
            raise ExtractionError("a primitive function may only call operators")
        self._qnn_register(call)
        inputs: list[te.Tensor] = []
        for arg in call.args:
            inputs.extend(self.visit(arg))
        if op.name == "device_copy":
            raise ExtractionError("device_copy cannot be lowered inside a primitive function")
        self._note_anchor(op)
        if self._qnn_in_pattern(op.name):
            if op.name != "qnn.requantize":
                self.readable += "_" + op.name
                return inputs
            anchor = self.qnn_anchor
            assert anchor is not None  # a matched pattern always starts at an anchor
            lowered = te_compiler.lower_call(anchor, inputs, self.target, call.checked_type)
            self.qnn_registered.clear()
        else:
            otype = _return_type(call.checked_type)
            lowered = te_compiler.lower_call(call, inputs, self.target, otype)
        outputs = list(lowered.outputs)
        if len(outputs) != 1 and not isinstance(call.checked_type, relay.TupleType):
            raise ExtractionError(f"{op.name} returned {len(outputs)} tensors for a non-tuple type")
        self.readable += "_" + op.name
        return outputs

    def _note_anchor(self, op: tvm.ir.Op) -> None:
        # The op with the highest pattern, the later one on ties: upstream's schedule anchor.
        pattern = int(op.get_attr("TOpPattern") or 0)
        if pattern >= self.anchor_pattern:
            self.anchor_op, self.anchor_pattern = op.name, pattern

    def _qnn_register(self, call: relay.Call) -> None:
        name = call.op.name
        self.qnn_registered.insert(0, name if name in _QNN_MEMBERS else "")
        if name in _QNN_ANCHORS:
            self.qnn_anchor = call

    def _qnn_in_pattern(self, name: str) -> bool:
        if name not in _QNN_MEMBERS or not self.qnn_registered:
            return False
        seq = self.qnn_registered
        return any(
            tuple(seq[i : i + len(pat)]) == pat
            for pat in _QNN_PATTERNS
            for i in range(len(seq) - len(pat) + 1)
        )


@functools.cache
def _index_is_int64() -> bool:
    return str(tvm.support.libinfo().get("INDEX_DEFAULT_I64", "OFF")) == "ON"


def te_shape(shape: Any) -> list[Any]:
    """Upstream's ``GetShape``: constant dims as int32 (unless TVM indexes with int64), ``Any``
    dims as size vars. ``te_compiler.get_shape`` does the same but rebuilds TVM's whole
    ``libinfo`` dictionary for every dimension, which made it the slowest step of lowering."""
    result: list[Any] = []
    for dim in shape:
        if isinstance(dim, tir.IntImm):
            result.append(dim if _index_is_int64() else tir.IntImm("int32", int(dim)))
        elif isinstance(dim, tir.Any):
            result.append(te.size_var("any_dim", "int32"))
        else:
            result.append(dim)
    return result


def _return_type(ttype: Any) -> Any:
    """The output type ``lower_call`` would derive from a call's type, computed once here."""
    if isinstance(ttype, relay.TensorType):
        return relay.TensorType(te_shape(ttype.shape), ttype.dtype)
    if isinstance(ttype, relay.TupleType):
        return relay.TupleType(
            [
                relay.TensorType(te_shape(f.shape), f.dtype)
                if isinstance(f, relay.TensorType)
                else f
                for f in ttype.fields
            ]
        )
    return ttype


def flatten_tuple_type(ty: Any) -> list[relay.TensorType]:
    """The tensor types of a (possibly nested) tuple type, in order."""
    if isinstance(ty, relay.TensorType):
        return [ty]
    if isinstance(ty, relay.TupleType):
        return [t for field in ty.fields for t in flatten_tuple_type(field)]
    raise ExtractionError(f"cannot lower a parameter of type {ty}")


def _scalar_imm(data: tvm.nd.NDArray) -> tir.PrimExpr:
    dtype = str(data.dtype)
    value = data.numpy()
    if dtype in ("float16", "float32", "float64"):
        return tir.FloatImm(dtype, float(value))
    if dtype in ("int8", "int16", "int32", "int64", "uint8", "bool"):
        return tir.IntImm(dtype, int(np.asarray(value).astype(np.int64)))
    raise ExtractionError(f"scalar constants of dtype {dtype} cannot be lowered to TE")
