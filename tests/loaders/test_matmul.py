"""ONNX MatMuls reach TVM in the layouts TOPI schedules well: by a 2-D weight a dense layer, of
two activations a batch_matmul of the second transposed (hhb-tvm's frontend gave a
batch_matmul of neither transposed, which TOPI ran at about 1 GFLOP/s)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relay
from tvm.contrib import graph_executor

import relay_tasks
from relay_tasks import load_model


def _attention_onnx(path: Path) -> tuple[Path, np.ndarray]:
    """``(x @ w) @ (x @ w)^T`` over a batch of 2, as an ONNX file, and ``w``."""
    weight = np.random.default_rng(0).standard_normal((16, 8)).astype("float32")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Transpose", ["h"], ["t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["h", "t"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 3])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path, weight


def _calls(mod: tvm.IRModule) -> list[tuple[str, bool | None]]:
    """Each matrix product: its operator, and for a batch_matmul whether ``b`` is transposed."""
    found: list[tuple[str, bool | None]] = []

    def visit(expr: relay.Expr) -> None:
        if isinstance(expr, relay.Call) and expr.op.name in ("nn.dense", "nn.batch_matmul"):
            transposed = bool(expr.attrs.transpose_b) if expr.op.name == "nn.batch_matmul" else None
            found.append((expr.op.name, transposed))

    relay.analysis.post_order_visit(mod["main"], visit)
    return found


def test_a_matmul_by_a_weight_is_a_dense_layer_and_of_activations_a_transposed_batch_matmul(
    tmp_path: Path,
) -> None:
    path, weight = _attention_onnx(tmp_path / "attention.onnx")
    mod, params = load_model(path)
    assert sorted(_calls(mod)) == [("nn.batch_matmul", True), ("nn.dense", None)]
    x = np.random.default_rng(1).standard_normal((2, 3, 16)).astype("float32")
    lib = relay.build(mod, target=relay_tasks.host_target(), params=params)
    graph = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    graph.set_input("x", x)
    graph.run()
    h = x @ weight
    np.testing.assert_allclose(graph.get_output(0).numpy(), h @ h.transpose(0, 2, 1), rtol=1e-5)
