"""The values TVM's frontends ask for while converting: numpy's answers are TVM's to the bit, the
conversion is the frontend's own (its types too, found without the Prelude where a graph uses
none of it), a Llama's conversion builds nothing with LLVM, and an ONNX file's shape arithmetic
neither."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relay
from tvm.relay.frontend import common

from relay_tasks import load_model
from relay_tasks.loaders import load_file, values
from relay_tasks.loaders.fastmath import approximate_math
from relay_tasks.loaders.matmul import dense_weights

from frontend_models import onnx_file, torch_module

#: Models whose conversion asks for values, and the least number numpy answers in each (so no
#: row passes on nothing).
ASKING = {
    "bert-2-layers": ((), 10),
    "gpt2-2-layers": ((), 40),
    "vit-small": ((), 10),
    "llama-2-layers": ((pytest.mark.slow,), 25),
    "t5-2-layers": ((pytest.mark.slow,), 10),
}


def _rows() -> list[Any]:
    return [pytest.param(name, marks=marks, id=name) for name, (marks, _) in ASKING.items()]


def _answered(monkeypatch: pytest.MonkeyPatch) -> list[tuple[relay.Expr, dict, tvm.nd.NDArray]]:
    """Every expression numpy answers from here on, with its params and the answer."""
    answered = []
    ours = values.folded_value

    def recorded(expr: relay.Expr, params: Any) -> Any:
        value = ours(expr, params)
        if value is not None:
            answered.append((expr, dict(params), value))
        return value

    monkeypatch.setattr(values, "folded_value", recorded)
    return answered


def _same_bits(ours: np.ndarray, theirs: np.ndarray) -> bool:
    return (
        ours.dtype == theirs.dtype
        and ours.shape == theirs.shape
        and ours.tobytes() == theirs.tobytes()
    )


@pytest.mark.parametrize("name", _rows())
def test_every_value_numpy_gives_a_frontend_is_tvms_to_the_bit(name: str, monkeypatch) -> None:
    tvm_infer_value = common.infer_value
    answered = _answered(monkeypatch)
    module, example = torch_module(name)
    load_model(module, example_inputs=example)
    assert len(answered) >= ASKING[name][1]
    for expr, params, value in answered:
        theirs = tvm_infer_value(expr, params).numpy()
        assert _same_bits(value.numpy(), theirs), expr


def _matmuls_onnx(path: Path) -> Path:
    """Batched MatMuls (their shape arithmetic: constant ``concatenate``, ``strided_slice``,
    ``maximum``, folded by the frontend) and a Reshape, as an ONNX file."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype("float32"), name)
               for name, shape in [("b", (2, 16, 8)), ("w", (8, 4))]]  # fmt: skip
    weights.append(numpy_helper.from_array(np.array([0, -1], "int64"), "flat"))
    nodes = [helper.make_node("MatMul", ["x", "b"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["g"]),
             helper.make_node("Reshape", ["g", "flat"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "matmuls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])], initializer=weights,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


#: ONNX files whose conversion folds, and the least number of folds numpy answers in each.
FOLDING = {
    "matmuls": ((), 4),
    "bert-2-layers": ((pytest.mark.slow,), 100),
}


def _onnx(name: str, folder: Path) -> Path:
    return _matmuls_onnx(folder / "matmuls.onnx") if name == "matmuls" else onnx_file(name)


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=marks) for name, (marks, _) in FOLDING.items()]
)
def test_every_fold_numpy_gives_the_onnx_frontend_is_tvms_to_the_bit(
    name: str, tmp_path: Path, monkeypatch
) -> None:
    """Each expression free of inputs that numpy answers, TVM's ``fold_constant`` folds to a
    constant of the same bits (its ``infer_value`` computes them too)."""
    tvm_fold_constant, tvm_infer_value = common.fold_constant, common.infer_value
    answered = _answered(monkeypatch)
    load_file("onnx", _onnx(name, tmp_path), None, None, None)  # in this process: spied on
    folds = [(expr, value) for expr, params, value in answered if not params]
    assert len(folds) >= FOLDING[name][1]
    for expr, value in folds:
        theirs = tvm_fold_constant(expr)
        assert isinstance(theirs, relay.Constant), expr
        assert _same_bits(value.numpy(), theirs.data.numpy()), expr
        assert _same_bits(value.numpy(), tvm_infer_value(expr, {}).numpy()), expr


def test_an_onnx_conversion_is_the_frontends_own_and_its_shape_arithmetic_builds_nothing(
    tmp_path: Path,
) -> None:
    path = _matmuls_onnx(tmp_path / "matmuls.onnx")
    built: list[Any] = []
    build_llvm = tvm.get_global_func("target.build.llvm")

    def counted(*args: Any) -> Any:
        built.append(args[0])
        return build_llvm(*args)

    tvm.register_func("target.build.llvm", counted, override=True)
    try:
        ours, our_params = load_file("onnx", path, None, None, None)  # here, counted
        ours_built = len(built)
        theirs, their_params = relay.frontend.from_onnx(onnx.load(str(path)), freeze_params=True)
    finally:
        tvm.register_func("target.build.llvm", build_llvm, override=True)
    assert ours_built == 0 < len(built)  # TVM's own fold built each folded call
    # The MatMuls as upstream's frontend gives them (relay_tasks.loaders.matmul), no more.
    assert tvm.ir.structural_equal(ours, dense_weights(theirs), map_free_vars=True)
    assert sorted(our_params) == sorted(their_params)


def _builds(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each ``relay.build`` from here on (TVM's ``infer_value`` builds through it)."""
    built: list[Any] = []
    build = relay.build

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(args[0])
        return build(*args, **kwargs)

    monkeypatch.setattr(relay, "build", counted)
    return built


def _prelude_copies(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each module the frontend fills with the Prelude to type one node, from here on."""
    filled: list[Any] = []
    update = tvm.IRModule.update

    def counted(mod: tvm.IRModule, other: Any) -> Any:
        filled.append(other)
        return update(mod, other)

    monkeypatch.setattr(tvm.IRModule, "update", counted)
    return filled


def _frontends_own(module: torch.nn.Module, example: torch.Tensor) -> tuple[tvm.IRModule, dict]:
    """The module as TVM's PyTorch frontend converts it alone."""
    from tvm.relay.frontend import from_pytorch

    with torch.no_grad():
        traced = torch.jit.trace(module, example)
    inputs = [(name, (list(example.shape), str(example.dtype).removeprefix("torch.")))
              for name in ["input_ids"]]  # fmt: skip
    mod, params = from_pytorch(traced, inputs)
    return mod, dict(params.items())


@pytest.mark.parametrize(
    "name", [pytest.param("gpt2-2-layers"), pytest.param("llama-2-layers", marks=pytest.mark.slow)]
)
def test_a_conversion_is_the_frontends_own_and_builds_nothing(name: str, monkeypatch) -> None:
    module, example = torch_module(name)
    theirs, their_params = _frontends_own(module, example)
    built = _builds(monkeypatch)
    filled = _prelude_copies(monkeypatch)
    ours, our_params = load_model(module, example_inputs=example)
    assert built == []
    assert filled == []
    # exp, erf, tanh and softmax as TVM's approximations (relay_tasks.loaders.fastmath), no more.
    assert tvm.ir.structural_equal(ours, approximate_math(theirs), map_free_vars=True)
    assert sorted(our_params) == sorted(their_params)
    for key, value in our_params.items():
        assert _same_bits(value.numpy(), their_params[key].numpy()), key


def test_without_numpy_the_frontend_builds(monkeypatch) -> None:
    """The count above can fail: TVM's own ``infer_value`` builds for the same conversion."""
    monkeypatch.setattr(values, "folded_value", lambda expr, params: None)
    built = _builds(monkeypatch)
    module, example = torch_module("gpt2-2-layers")
    load_model(module, example_inputs=example)
    assert built


def test_what_numpy_cannot_fold_goes_to_tvm() -> None:
    x = relay.var("x", shape=(2,), dtype="float32")
    assert values.folded_value(relay.cos(relay.const(np.float32([0.5, 1.0]))), {}) is None
    assert values.folded_value(x + relay.const(np.float32(1)), {}) is None
    bound = values.folded_value(x + relay.const(np.float32(1)), {"x": np.float32([1, 2])})
    assert bound is not None and bound.numpy().tolist() == [2.0, 3.0]


def test_a_number_is_no_expression_as_in_tvm() -> None:
    """TVM's ``infer_value`` fails on a Python number too; the frontends' ``try_infer_value``
    then keeps the number, as it does here."""
    ask = values.numpy_first(common.infer_value)
    with pytest.raises(TypeError):
        ask(3, {})
    with pytest.raises(Exception):  # noqa: B017 (TVM raises its own error kinds)
        common.infer_value(3, {})


class ListLoop(torch.nn.Module):
    """A scripted loop over a List ADT: converted with the Prelude's functions and types."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs: list[torch.Tensor] = []
        for i in range(int(x.size(0))):
            outs = outs + [x[i] * 2.0]  # noqa: RUF005 (aten::add on lists: the List ADT)
        return torch.stack(outs)


def test_a_graph_of_prelude_functions_is_typed_as_the_frontend_types_it() -> None:
    from tvm.relay.frontend import from_pytorch

    script = torch.jit.script(ListLoop())
    theirs, _ = from_pytorch(script, [("x", ([3, 4], "float32"))])
    ours, _ = load_model(script, shapes={"x": [3, 4]})
    assert "tensor_array_stack_float32_4" in [g.name_hint for g in ours.get_global_vars()]
    assert tvm.ir.structural_equal(ours, theirs, map_free_vars=True)
