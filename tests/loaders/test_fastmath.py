"""exp, erf, tanh and softmax reach TVM as its approximations (TOPI's erf calls libm per element:
3.5 of BERT-2's 26 ms), which stay within a few float32 ulps of the exact functions."""

from __future__ import annotations

import json
import math

import numpy as np
import torch
import tvm
from tvm import relay

import relay_tasks
from relay_tasks import load_model
from relay_tasks.cli import main
from relay_tasks.loaders.fastmath import APPROXIMATIONS, approximate_math

from checks import ops_called


def _evaluate(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    run = relay.create_executor("graph", mod=mod, target=relay_tasks.host_target()).evaluate()
    return run(*args).numpy()


def test_each_function_is_its_approximation_within_a_few_ulps() -> None:
    x = np.linspace(-20, 20, 40001).astype("float32")
    wide = x.astype("float64")
    exact = {"exp": np.exp(wide), "erf": np.vectorize(math.erf)(wide), "tanh": np.tanh(wide)}
    for op, expected in exact.items():
        data = relay.var("x", shape=x.shape)
        mod = tvm.IRModule.from_expr(relay.Function([data], getattr(relay, op)(data)))
        fast = approximate_math(mod)
        assert ops_called(fast) == [APPROXIMATIONS[op]]
        error = np.abs(_evaluate(fast, x) - expected)
        if op == "exp":
            error = error / expected
        assert error.max() < 5e-7, op


def test_softmax_keeps_its_axis_and_a_module_without_these_is_returned_as_it_is() -> None:
    x = np.random.default_rng(0).standard_normal((3, 5)).astype("float32")
    data = relay.var("x", shape=x.shape)
    mod = tvm.IRModule.from_expr(relay.Function([data], relay.nn.softmax(data, axis=0)))
    fast = approximate_math(mod)
    assert ops_called(fast) == ["nn.fast_softmax"]
    expected = np.exp(x) / np.exp(x).sum(axis=0)
    np.testing.assert_allclose(_evaluate(fast, x), expected, rtol=1e-6)
    plain = tvm.IRModule.from_expr(relay.Function([data], relay.nn.relu(data)))
    assert approximate_math(plain).same_as(plain)


def test_a_loaded_model_computes_with_the_approximations_what_torch_does() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Tanh()).eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = model(x).numpy()
    mod, params = load_model(model, example_inputs=x)
    assert {"fast_erf", "fast_tanh"} <= set(ops_called(mod))
    assert not {"erf", "tanh"} & set(ops_called(mod))
    bound = relay.build_module.bind_params_by_name(mod["main"], params)
    got = _evaluate(tvm.IRModule.from_expr(bound), x.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_exact_math_keeps_the_frontends_functions_in_the_api_and_the_cli(tmp_path, capsys) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Softmax(-1))
    x = torch.randn(4, 8)
    mod, _ = load_model(model.eval(), example_inputs=x, exact_math=True)
    assert {"erf", "nn.softmax"} <= set(ops_called(mod))
    assert not {"fast_erf", "nn.fast_softmax"} & set(ops_called(mod))
    path = tmp_path / "gelu.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (x,), str(path), input_names=["x"])
    names = {}
    for flags in ([], ["--exact-math"]):
        assert main(["extract", str(path), "--format", "json", *flags]) == 0
        names[bool(flags)] = " ".join(
            t["name"] for t in json.loads(capsys.readouterr().out)["tasks"]
        )
    assert "fast_erf" in names[False] and "fast_softmax" in names[False]
    assert "fast" not in names[True] and "erf" in names[True] and "softmax" in names[True]
