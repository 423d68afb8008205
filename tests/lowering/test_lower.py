"""TE lowering: ours equals upstream's C++ ``LowerToPrimFunc``, function by function."""

from __future__ import annotations

import pytest
import tvm
from tvm import relay

from relay_tasks import extract_tasks
from relay_tasks.adapters.meta_schedule import DEFAULT_PASS_CONFIG, tir_module
from relay_tasks.lowering.cxx import std_hash_string
from relay_tasks.lowering.lower import MAX_FUNC_NAME_LENGTH, fused_function_name

from zoo import X86, load, model_target_rows


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_each_function_lowers_like_upstream(model: str, target: str) -> None:
    mod, params = load(model)
    tasks = extract_tasks(mod, target, params, pass_config=DEFAULT_PASS_CONFIG)
    lower_to_prim_func = tvm.get_global_func("relay.backend.LowerToPrimFunc")
    with tvm.target.Target(target), tvm.transform.PassContext(3, config=dict(DEFAULT_PASS_CONFIG)):
        for task in tasks:
            ours = tir_module(task)
            if ours is None:  # declined by the converter: upstream's helper would abort instead
                continue
            theirs = lower_to_prim_func(task.func, tvm.target.Target(target))
            assert tvm.ir.structural_equal(ours["main"], theirs), task.name


def test_long_fused_names_are_shortened_with_a_hash() -> None:
    readable = "fused_" + "_".join(["multiply", "add"] * 10)
    short = fused_function_name(readable)
    assert short == f"{readable[:MAX_FUNC_NAME_LENGTH]}_{std_hash_string(readable):x}_"
    assert fused_function_name("fused_nn.relu") == "fused_nn.relu"


def test_long_chain_gets_upstreams_shortened_name() -> None:
    from tvm import meta_schedule as ms

    x = relay.var("x", shape=(4, 4))
    out = x
    for i in range(20):
        out = relay.exp(out) if i % 2 else relay.sigmoid(out)
    mod = tvm.IRModule.from_expr(relay.Function([x], out))
    expected = ms.relay_integration.extract_tasks(mod, tvm.target.Target(X86), {})
    (task,) = extract_tasks(mod, X86, pass_config=DEFAULT_PASS_CONFIG)
    assert len(task.name) > MAX_FUNC_NAME_LENGTH
    assert task.name.replace(".", "_") == expected[0].task_name
