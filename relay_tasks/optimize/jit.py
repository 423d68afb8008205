"""TVM's kernels for the calls numpy leaves: lowered as ``FoldConstant`` lowers each, built once.

TVM's ``FoldConstant`` evaluates a call on constants by lowering it alone with its interpreter's
passes (``FuseOps`` at level 0: the op is a kernel of its own, each constant a parameter of it)
and building that kernel with LLVM: a build and an MCJIT load per call, 27 of them on a T5
encoder (relative position buckets), 20 on a Llama decoder (rotary tables, causal mask). What a
kernel computes depends on the op, its attributes and its arguments' types, never on their
values, so every such call of an extraction is lowered the same way here and all the kernels go
into one module, built once; each kernel then runs on its call's arguments and gives TVM's value
bit for bit. Numpy is no substitute for the transcendental ops among them: on a million float32
inputs, numpy's ``log``, ``cos``, ``sin``, ``exp`` and ``tanh`` differ from the libm functions
TVM's kernels call in 6% to 21% of the results.

Nothing is built until a value is needed (:mod:`.placeholders` asks): most of these results
only ever become arguments of fused functions, which no task contains.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tvm
from tvm import relay
from tvm.autotvm.task.topi_integration import TaskExtractEnv
from tvm.relay.qnn import transform as qnn_transform

from ..ir import raw_data

#: The target hhb-tvm's FoldConstant evaluates on, a string in its library (upstream's is plain
#: ``llvm``); tests/optimize/test_jit.py checks that TVM's own fold builds for it.
FOLD_TARGET = "llvm -mtriple=x86_64-unknown-linux"

Value = Any  # a tvm.nd.NDArray, or a tuple of values

_LOWER_TE = tvm.get_global_func("relay.tec.LowerTE")
_PLAN_DEVICES = tvm.get_global_func("relay._transform.PlanDevices")
_COMPILATION_CONFIG = tvm.get_global_func("target.MakeCompilationConfig")
#: Calls FoldConstant never evaluates, whatever their arguments.
_NEVER_EVALUATED = frozenset({"device_copy", "shape_of", "vm.shape_of", "ndarray_size"})


def evaluated_by_tvm(op: tvm.ir.Op) -> bool:
    """Whether TVM's FoldConstant evaluates a call of ``op`` whose arguments are all constants
    (it skips stateful ops, ops that compute nothing, and queries of shapes and devices)."""
    if op.name in _NEVER_EVALUATED:
        return False
    return not op.get_attr("TOpIsStateful") and not op.get_attr("TNonComputational")


class Kernels:
    """The calls of one extraction awaiting TVM's evaluation, and their kernels once built.

    :meth:`add` takes a call whose arguments are constants (or tuples of them) and returns its
    index; :meth:`run` gives its value from the arguments' values, building first every kernel
    added so far and not yet built, in one module.
    """

    def __init__(self) -> None:
        self._calls: list[relay.Call] = []
        self._programs: dict[int, Callable[[Sequence[tvm.nd.NDArray]], Value]] = {}
        #: How many builds this extraction made (each LLVM module counts one).
        self.builds = 0

    def add(self, call: relay.Call) -> int:
        self._calls.append(call)
        if _templates_traced():
            # Upstream's fold lowers each call as it evaluates it, and AutoTVM's extraction
            # records the templates that lowering runs (a product of rotary tables is a
            # batch_matmul task): lowered now, in the fold's order, for the record.
            with tvm.transform.PassContext():
                _lowered({"c": _with_parameters(call)})
        return len(self._calls) - 1

    def run(self, index: int, operands: Sequence[tvm.nd.NDArray]) -> Value:
        """``index``'s value, given the values of its constant operands in the order
        :func:`constant_leaves` lists them."""
        if index not in self._programs:
            self._build([i for i in range(len(self._calls)) if i not in self._programs])
        return self._programs[index](operands)

    def _build(self, indices: list[int]) -> None:
        with tvm.transform.PassContext():  # as fresh as the one TVM's fold evaluates in
            try:
                lowered = _lowered({f"c{i}": _with_parameters(self._calls[i]) for i in indices})
            except tvm.TVMError:  # one call's lowering fails: TVM's fold fails on it alone
                for i in indices:
                    self._programs[i] = _folded_by_tvm(self._calls[i])
                return
            kernels = {
                gvar: func
                for gvar, func in lowered.functions.items()
                if isinstance(func, tvm.tir.PrimFunc)
            }
            # Looked up now, as TVM's interpreter looks it up: a hook registered there sees it.
            build = tvm.get_global_func("relay.backend.build")
            runtime = build(tvm.IRModule(kernels), tvm.target.Target(FOLD_TARGET))
            self.builds += 1
        for i in indices:
            program = _Program(lowered[f"c{i}"], runtime)
            self._programs[i] = program.run if program.plain else _folded_by_tvm(self._calls[i])


def _templates_traced() -> bool:
    env = TaskExtractEnv.current
    return env is not None and bool(env.tracing)


def constant_leaves(args: Sequence[relay.Expr]) -> list[relay.Constant] | None:
    """A call's arguments when all are constants, tuples of constants flattened in order; else
    None (FoldConstant evaluates only calls with arguments, all of them constants)."""
    if not args:
        return None
    flat: list[relay.Constant] = []
    pending = list(reversed(args))
    while pending:
        arg = pending.pop()
        if isinstance(arg, relay.Tuple):
            pending.extend(reversed(arg.fields))
        elif isinstance(arg, relay.Constant):
            flat.append(arg)
        else:
            return None
    return flat


def _with_parameters(call: relay.Call) -> relay.Function:
    """``call`` as a function of its constants: the same kernel, since FuseOps at level 0 makes
    every constant argument a parameter of the op's function anyway."""
    params: list[relay.Var] = []

    def swap(arg: relay.Expr) -> relay.Expr:
        if isinstance(arg, relay.Tuple):
            return relay.Tuple([swap(field) for field in arg.fields])
        data = raw_data(arg)  # a placeholder's shape and dtype; its values are not needed
        param = relay.var(f"p{len(params)}", shape=data.shape, dtype=data.dtype)
        params.append(param)
        return param

    args = [swap(arg) for arg in call.args]
    return relay.Function(params, relay.Call(call.op, args, call.attrs, call.type_args))


def _lowered(functions: dict[str, relay.Function]) -> tvm.IRModule:
    """The functions lowered by the interpreter's passes, as TVM's fold lowers each call."""
    config = _COMPILATION_CONFIG(
        tvm.transform.PassContext.current(), [tvm.target.Target(FOLD_TARGET)]
    )
    mod = tvm.IRModule(functions).with_attr(
        "executor", relay.backend.Executor("graph", {"link-params": False})
    )
    transform = relay.transform
    passes = tvm.transform.Sequential(
        [
            transform.SimplifyInference(),
            qnn_transform.Legalize(),
            _PLAN_DEVICES(config),
            transform.FuseOps(0),
            transform.ToANormalForm(),
            transform.EtaExpand(expand_constructor=True, expand_global_var=False),
            transform.InferType(),
            _LOWER_TE("intrp", config),
        ]
    )
    return passes(mod)


class _Program:
    """One lowered call: its function's body (let-bound kernel calls on its parameters), run on
    the kernels of ``runtime``. ``plain`` is False when the body holds anything else (a kernel
    with a dynamic shape, say); such a call is left to TVM's own fold."""

    def __init__(self, func: relay.Function, runtime: tvm.runtime.Module) -> None:
        self.func = func
        self.runtime = runtime
        nodes: list[Any] = []
        relay.analysis.post_order_visit(func.body, nodes.append)
        self.plain = all(_plain(node) for node in nodes)

    def run(self, operands: Sequence[tvm.nd.NDArray]) -> Value:
        values: dict[Any, Value] = {}
        for param, value in zip(self.func.params, operands, strict=True):
            values[param] = value
        return self._value(self.func.body, values)

    def _value(self, expr: relay.Expr, values: dict[Any, Value]) -> Value:
        while isinstance(expr, relay.Let):
            values[expr.var] = self._value(expr.value, values)
            expr = expr.body
        if isinstance(expr, relay.Var):
            return values[expr]
        if isinstance(expr, relay.Constant):
            return raw_data(expr)
        if isinstance(expr, relay.Tuple):
            return tuple(self._value(field, values) for field in expr.fields)
        if isinstance(expr, relay.TupleGetItem):
            return self._value(expr.tuple_value, values)[expr.index]
        if expr.op.name == "on_device":
            return self._value(expr.args[0], values)
        kernel, inputs = expr.args[0], self._value(expr.args[1], values)
        outputs = _allocated(expr.checked_type)
        self.runtime[kernel.name_hint](*_flat(inputs), *_flat(outputs))
        return outputs


def _plain(node: Any) -> bool:
    if isinstance(node, (relay.Var, relay.Constant, relay.Tuple, relay.TupleGetItem, relay.Let)):
        return True
    if isinstance(node, (tvm.ir.Op, tvm.ir.GlobalVar)):
        return True
    if not isinstance(node, relay.Call) or not isinstance(node.op, tvm.ir.Op):
        return False
    if node.op.name == "on_device":
        return True
    # A kernel whose output shape is computed at run time would need its shape function.
    return node.op.name == "call_lowered" and static(node.checked_type)


def static(ttype: Any) -> bool:
    if isinstance(ttype, relay.TupleType):
        return all(static(field) for field in ttype.fields)
    return isinstance(ttype, relay.TensorType) and all(
        isinstance(d, tvm.tir.IntImm) for d in ttype.shape
    )


def _allocated(ttype: Any) -> Value:
    if isinstance(ttype, relay.TupleType):
        return tuple(_allocated(field) for field in ttype.fields)
    return tvm.nd.empty([int(d) for d in ttype.shape], str(ttype.dtype))


def _flat(value: Value) -> list[tvm.nd.NDArray]:
    if isinstance(value, tuple):
        return [array for field in value for array in _flat(field)]
    return [value]


_FOLD_CONSTANT_EXPR = tvm.get_global_func("relay._transform.FoldConstantExpr")


def folded_alone(call: relay.Call) -> relay.Expr:
    """TVM's own fold of ``call``, an op call on constants (filled): a build of its own."""
    folded: relay.Expr = _FOLD_CONSTANT_EXPR(call, tvm.IRModule(), False)
    return folded


def _folded_by_tvm(call: relay.Call) -> Callable[[Sequence[tvm.nd.NDArray]], Value]:
    """TVM's own fold of ``call``, for calls the batch cannot take."""

    def run(operands: Sequence[tvm.nd.NDArray]) -> Value:
        del operands  # the call holds its constants, filled by the time this runs
        return _as_value(folded_alone(call))

    return run


def _as_value(expr: relay.Expr) -> Value:
    if isinstance(expr, relay.Tuple):
        return tuple(_as_value(field) for field in expr.fields)
    return expr.data
