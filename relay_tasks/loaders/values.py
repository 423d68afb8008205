"""Values TVM's frontends compute while they convert, answered in numpy where it gives TVM's bits.

A frontend that needs a value to build the graph (a slice bound, a repeat count, a shape it
reshapes to) calls ``infer_value``: TVM builds the expression with LLVM and runs it, a build per
call, 57 of them in a 4-layer Llama's conversion (0.75 s), and that for expressions that are
mostly a constant already (38 of them) or integer arithmetic on one. A further 54 of its calls
there ask about a Python number, which TVM answers with an error whose message alone costs
11 ms. Here an expression free of inputs is folded by the extraction's numpy folder (the
evaluators that match TVM's kernels bit for bit) and its value returned when it folds to a
constant; anything else goes to TVM's ``infer_value`` as before.

The ONNX frontend asks for the same in another form: ``fold_constant``, TVM's ``FoldConstant``
on one expression, 202 calls in a 2-layer BERT's conversion, of which 125 hold no input at all
(the shape arithmetic of each ``MatMul``, ``Reshape`` and ``Expand``) and cost 277 LLVM
builds, 9 of the conversion's 12 s. An expression free of inputs is its value, and numpy's
where it folds whole; anything else is TVM's ``fold_constant``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import tvm
from tvm import relay

from ..ir import patched
from ..optimize.fold import prefold_function

InferValue = Callable[..., tvm.nd.NDArray]
FoldConstant = Callable[..., relay.Expr]


def folded_value(expr: relay.Expr, params: Mapping[str, Any]) -> tvm.nd.NDArray | None:
    """``expr``'s value with ``params`` bound to its free variables, where numpy folds it whole;
    None where TVM has to compute it (an op numpy does not evaluate, a variable ``params`` has no
    value for: TVM's own error then)."""
    if isinstance(expr, relay.Constant):
        return expr.data.copyto(tvm.cpu())
    free = relay.analysis.free_vars(expr)
    if any(var.name_hint not in params for var in free):
        return None
    bound = relay.bind(expr, {var: relay.const(params[var.name_hint]) for var in free})
    try:
        mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([], bound)))
    except tvm.TVMError:
        return None
    body = prefold_function(mod["main"])[0].body
    return body.data.copyto(tvm.cpu()) if isinstance(body, relay.Constant) else None


def numpy_first(tvm_infer_value: InferValue) -> InferValue:
    """An ``infer_value`` that asks :func:`folded_value` before TVM's ``tvm_infer_value``."""

    def infer_value(input_val: Any, params: Mapping[str, Any], mod: Any = None) -> Any:
        if not isinstance(input_val, relay.Expr):
            # TVM's answer too (it fails converting the number), at 11 ms for the message.
            raise TypeError(f"not a Relay expression: {type(input_val).__name__}")
        value = folded_value(input_val, params)
        return tvm_infer_value(input_val, params, mod) if value is None else value

    return infer_value


def folded_first(tvm_fold_constant: FoldConstant) -> FoldConstant:
    """A ``fold_constant`` that folds an expression free of inputs with :func:`folded_value`
    before TVM's ``tvm_fold_constant`` (which folds such an expression to its value too)."""

    def fold_constant(node: Any, mod: Any = None) -> Any:
        if mod is None and isinstance(node, relay.Expr) and not relay.analysis.free_vars(node):
            value = folded_value(node, {})
            if value is not None:
                return relay.Constant(value)
        return tvm_fold_constant(node, mod)

    return fold_constant


@contextlib.contextmanager
def values_in_numpy(frontend: Any) -> Iterator[None]:
    """``frontend`` (a frontend module, holding its own aliases of the functions) computes its
    values with :func:`numpy_first` and folds with :func:`folded_first` inside; ``common``'s
    own helpers (``try_infer_value``, ``infer_value_simulated``) read the names from
    ``common``, patched too."""
    from tvm.relay.frontend import common

    theirs_and_ours = [
        (common.infer_value, numpy_first(common.infer_value)),
        (common.fold_constant, folded_first(common.fold_constant)),
    ]
    with contextlib.ExitStack() as stack:
        for owner in (common, frontend):
            for theirs, ours in theirs_and_ours:
                for name in [name for name, v in vars(owner).items() if v is theirs]:
                    stack.enter_context(patched(owner, name, ours))
        yield
