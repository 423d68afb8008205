"""An ONNX MatMul by a 2-D weight as the dense layer it is, as upstream TVM's frontend converts it.

hhb-tvm's ONNX frontend converts ``MatMul(x, W)`` with a constant 2-D ``W`` to
``nn.batch_matmul(x, W[None], transpose_b=False)``, where upstream TVM's converts it to
``nn.dense`` on ``x`` flattened to 2-D and ``W`` transposed. TOPI has no fast schedule for a
batch_matmul of that layout: BERT-2 (sequence 128) exported from PyTorch took 1,788 ms in TVM,
1,808 of a profile's 1,818 in those calls, against 19.7 ms in ONNX Runtime. Every tuner then
starts from that default (AutoTVM's 10 minutes reached 1,436 ms). :func:`dense_weights`
rewrites each such call back to the dense form, and a MatMul of two activations (attention's)
to the batch_matmul of the second transposed, as upstream's frontend does by default
(``use_nt_batch_matmul``, off in hhb-tvm): 12.3 ms of the 36.9 left on BERT-2 were those. The
result is the same product, summed in another order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relay
from tvm.ir import IRModule
from tvm.relay.dataflow_pattern import DFPatternCallback, is_op, rewrite, wildcard

from ..ir import static_shape


class _Dense(DFPatternCallback):  # type: ignore[misc]
    """``batch_matmul(x, y)`` with neither operand transposed: a dense layer where ``y`` is a
    constant of one batch, else the batch_matmul of ``x`` and ``y`` transposed (the layout
    TOPI schedules well, which upstream's frontend gives by default)."""

    def __init__(self) -> None:
        super().__init__(require_type=True)
        self.data = wildcard()
        self.other = wildcard()
        self.pattern = is_op("nn.batch_matmul")(self.data, self.other).has_attr(
            {"transpose_a": False, "transpose_b": False}
        )

    def callback(self, pre: Any, post: Any, node_map: Any) -> Any:
        data, other = node_map[self.data][0], node_map[self.other][0]
        shape = pre.checked_type.shape
        out_dtype = pre.attrs.out_dtype
        if not static_shape(shape):
            return post
        if isinstance(other, relay.Constant) and other.data.shape[0] == 1:
            weight = other.data.numpy()
            flat = relay.reshape(data, (-1, weight.shape[1]))
            kernel = relay.const(np.ascontiguousarray(weight[0].T))
            product = relay.nn.dense(flat, kernel, units=weight.shape[2], out_dtype=out_dtype)
            return relay.reshape(product, [int(d) for d in shape])
        flipped = relay.transpose(other, [0, 2, 1])
        return relay.nn.batch_matmul(data, flipped, out_dtype=out_dtype, transpose_b=True)


def dense_weights(mod: IRModule) -> IRModule:
    """``mod`` with each batch_matmul by a one-batch constant weight as a dense layer."""
    typed = relay.transform.InferType()(mod)
    typed["main"] = rewrite(_Dense(), typed["main"])
    return relay.transform.InferType()(typed)
