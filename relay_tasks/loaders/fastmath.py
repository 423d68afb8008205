"""``exp``, ``erf``, ``tanh`` and softmax as TVM's own polynomial approximations.

TOPI computes ``erf`` by calling libm once per element, a scalar call in the middle of an
otherwise vectorised loop: BERT-2's GELU (786,432 elements) took 3.5 ms of a 26 ms profile,
against 1.1 ms as ``fast_erf``. ONNX Runtime approximates these functions too (MLAS). TVM's
approximations, timed on 400,001 points in [-20, 20] against float64: ``fast_erf`` within 3.3e-7
(TOPI's ``erf`` 4.5e-8), ``fast_exp`` within a relative 1.2e-7, ``fast_tanh`` within 2.7e-7;
infinities map as the exact functions map them, and a NaN stays NaN except through
``fast_erf``, which gives 1.

TVM's ``FastMath`` pass does the same rewrite at ``opt_level`` 4 but types the module first,
which a PyTorch conversion's module cannot always be (its main may name Prelude types it does
not define); this rewrite needs no types.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relay
from tvm.ir import IRModule
from tvm.relay.dataflow_pattern import DFPatternCallback, is_op, rewrite, wildcard

from ..ir import with_functions

#: Each operator and its approximation, which takes the same arguments and attributes.
APPROXIMATIONS = {
    "exp": "fast_exp",
    "erf": "fast_erf",
    "tanh": "fast_tanh",
    "nn.softmax": "nn.fast_softmax",
}


class _Approximated(DFPatternCallback):  # type: ignore[misc]
    def __init__(self, op: str) -> None:
        super().__init__(require_type=False)
        self.fast = tvm.ir.Op.get(APPROXIMATIONS[op])
        self.pattern = is_op(op)(wildcard())

    def callback(self, pre: Any, post: Any, node_map: Any) -> Any:
        return relay.Call(self.fast, post.args, post.attrs, post.type_args, post.span)


def approximate_math(mod: IRModule) -> IRModule:
    """``mod`` with every call in its main of an operator of :data:`APPROXIMATIONS` calling
    the approximation instead; the module itself where there is none."""
    main = mod["main"]
    fast = rewrite([_Approximated(op) for op in APPROXIMATIONS], main)
    if fast.same_as(main):
        return mod
    return with_functions(mod, {mod.get_global_var("main"): fast})
