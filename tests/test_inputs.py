"""Bad input: one clear error from the package's own types, naming the problem and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from relay_tasks import (
    ModelError,
    RelayTasksError,
    TargetError,
    UnusedParamsWarning,
    extract_tasks,
    host_target,
)
from relay_tasks.inputs import as_module, as_params, as_target

from zoo import X86, load


def _small() -> tuple[tvm.IRModule, dict]:
    return load("dense_softmax")


@pytest.mark.parametrize(
    ("mod", "match"),
    [
        (42, "expected a tvm.IRModule or tvm.relay.Function, got int"),
        ("resnet-50", "expected a tvm.IRModule or tvm.relay.Function, got str"),
        (tvm.IRModule(), "has no 'main' function \\(it has no functions\\)"),
    ],
    ids=["int", "str", "empty-module"],
)
def test_wrong_model_objects(mod: object, match: str) -> None:
    with pytest.raises(ModelError, match=match):
        extract_tasks(mod, X86)


def test_module_without_main_names_its_functions() -> None:
    x = relay.var("x", shape=(2,))
    mod = tvm.IRModule({tvm.ir.GlobalVar("forward"): relay.Function([x], relay.nn.relu(x))})
    with pytest.raises(ModelError, match=r"has no 'main' function \(it has forward\).*from_expr"):
        extract_tasks(mod, X86)


def test_a_relay_function_is_accepted() -> None:
    mod, params = _small()
    assert len(extract_tasks(mod["main"], X86, params)) == 3


@pytest.mark.parametrize(
    ("target", "error", "match"),
    [
        ("foo -mcpu=x", TargetError, "unknown or malformed target 'foo -mcpu=x' .*llvm.*cuda"),
        ("", TargetError, "unknown or malformed target ''"),
        (3.5, TargetError, "expected a target string or tvm.target.Target, got float"),
    ],
    ids=["unknown-kind", "empty", "float"],
)
def test_bad_targets(target: object, error: type, match: str) -> None:
    mod, params = _small()
    with pytest.raises(error, match=match):
        extract_tasks(mod, target, params)


def test_target_objects_pass_through() -> None:
    target = tvm.target.Target(X86)
    assert as_target(target) is target


def test_host_target_spells_out_the_cpu() -> None:
    target = host_target()
    assert target.kind.name == "llvm"
    assert "mtriple" in target.attrs and "mcpu" in target.attrs


def test_params_of_which_none_match_name_the_params_and_the_variables() -> None:
    mod, params = _small()
    wrong = {f"{name}_typo": value for name, value in params.items()}
    with pytest.raises(
        ModelError,
        match="none of the 4 param\\(s\\) match a parameter of main: b1_typo, b2_typo, w1_typo, "
        "w2_typo; main's parameters are: data, w1, b1, w2, b2; these look like another model's",
    ):
        extract_tasks(mod, X86, wrong)


def test_params_that_match_nothing_are_left_out_with_one_warning() -> None:
    """As upstream binds them (the others are bound), but said once, naming the first few."""
    mod, params = _small()
    extra = {f"aten::add__{i}.num_batches_tracked": np.zeros((), "int64") for i in range(7)}
    without_w1 = {name: value for name, value in params.items() if name != "w1"}
    with pytest.warns(UnusedParamsWarning) as caught:
        tasks = extract_tasks(mod, X86, {**without_w1, **extra, "w1_typo": params["w1"]})
    assert [str(w.message) for w in caught] == [
        "8 param(s) match no parameter of main and are not bound: aten::add__0.num_batches_tracked, "
        "aten::add__1.num_batches_tracked, aten::add__2.num_batches_tracked, "
        "aten::add__3.num_batches_tracked, aten::add__4.num_batches_tracked ...; drop them from "
        "params to silence this (upstream ignores them without a word)"
    ]
    assert caught[0].filename == __file__  # the warning points at the caller's line
    expected = extract_tasks(mod, X86, without_w1)
    assert [(t.name, t.weight) for t in tasks] == [(t.name, t.weight) for t in expected]
    assert all(
        tvm.ir.structural_equal(a.func, e.func) for a, e in zip(tasks, expected, strict=True)
    )


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ([1, 2], "expected params as a dict \\(or tvm.ir.Map\\) of name -> numpy array"),
        ({"w1": [1.0, 2.0]}, "param 'w1' is a list; pass a numpy array or tvm.nd.NDArray"),
        ({1: np.zeros(2)}, "param names must be strings, got 1"),
    ],
    ids=["list", "list-value", "int-name"],
)
def test_wrong_param_types(params: object, match: str) -> None:
    mod, _ = _small()
    with pytest.raises(ModelError, match=match):
        extract_tasks(mod, X86, params)


def test_numpy_and_ndarray_params_give_the_same_tasks() -> None:
    mod, params = _small()
    as_numpy = {k: v.numpy() for k, v in params.items()}
    names = [t.name for t in extract_tasks(mod, X86, params)]
    assert [t.name for t in extract_tasks(mod, X86, as_numpy)] == names


def test_duplicate_variable_names_cannot_be_bound_by_name() -> None:
    a, b = relay.var("w", shape=(2,)), relay.var("w", shape=(2,))
    mod = tvm.IRModule.from_expr(relay.Function([a, b], a + b))
    with pytest.raises(ModelError, match="several parameters named 'w'"):
        as_params({"w": np.zeros(2, "float32")}, as_module(mod))


def test_ill_typed_module_reports_the_type_error() -> None:
    x, y = relay.var("x", shape=(1, 4)), relay.var("y", shape=(3, 5))
    mod = tvm.IRModule.from_expr(relay.Function([x, y], relay.add(x, y)))
    with pytest.raises(ModelError, match="does not type-check: Incompatible broadcast type"):
        extract_tasks(mod, X86)


def test_the_callers_module_is_left_unchanged() -> None:
    mod, params = _small()
    before = mod["main"]
    extract_tasks(mod, X86, params)
    assert mod["main"].same_as(before)
    assert len(mod["main"].params) == 5


def test_every_error_is_a_relay_tasks_error() -> None:
    for error in (ModelError, TargetError):
        assert issubclass(error, RelayTasksError)
