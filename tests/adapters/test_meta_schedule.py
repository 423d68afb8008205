"""MetaSchedule adapter: equal to upstream's extraction on every zoo row, target and equality."""

from __future__ import annotations

import pytest
import tvm
from tvm import meta_schedule as ms

from relay_tasks import ModelError
from relay_tasks.adapters import get_adapter
from relay_tasks.adapters.meta_schedule import (
    DEFAULT_PASS_CONFIG,
    MODULE_EQUALITIES,
    extract_task_from_relay,
)

import oracles
from checks import assert_same_extracted_tasks
from zoo import CUDA, X86, load, model_target_rows


@pytest.mark.parametrize("module_equality", MODULE_EQUALITIES)
@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_equals_upstream_extraction(model: str, target: str, module_equality: str) -> None:
    expected = oracles.meta_schedule(model, target, module_equality)
    mod, params = load(model)
    actual = extract_task_from_relay(mod, target, params, module_equality=module_equality)
    assert_same_extracted_tasks(expected, actual)


def test_tasks_are_tunable_extracted_tasks(tmp_path) -> None:
    import tvm.tir.tensor_intrin.x86  # noqa: F401  (x86 schedule rules look these up)

    mod, params = load("dense_softmax")
    tasks = extract_task_from_relay(mod, f"{X86} -num-cores 2", params)
    contexts, weights = ms.relay_integration.extracted_tasks_to_tune_contexts(
        tasks, work_dir=str(tmp_path)
    )
    assert [int(w) for w in weights] == [t.weight for t in tasks]
    assert all(isinstance(t, ms.ExtractedTask) for t in tasks)
    assert [c.task_name for c in contexts] == [t.task_name for t in tasks]


def test_registry_rows_carry_the_native_tasks() -> None:
    mod, params = load("dense_softmax")
    rows = get_adapter("meta_schedule").extract(mod, X86, params)
    natives = extract_task_from_relay(mod, X86, params)
    assert [(r.name, r.weight) for r in rows] == [(t.task_name, t.weight) for t in natives]
    assert [r.anchor_op for r in rows] == ["nn.dense", "nn.dense", "nn.softmax"]


def test_unknown_module_equality_names_the_choices() -> None:
    mod, params = load("dense_softmax")
    with pytest.raises(ModelError, match="structural, ignore-ndarray, anchor-block"):
        extract_task_from_relay(mod, X86, params, module_equality="exact")


def test_pass_config_replaces_upstream_default_as_upstream_does() -> None:
    mod, params = load("conv_bias_bn_relu")
    config = {"relay.backend.use_meta_schedule": True, "relay.FuseOps.max_depth": 1}
    expected = ms.relay_integration.extract_tasks(
        load("conv_bias_bn_relu")[0], tvm.target.Target(X86), params, pass_config=config
    )
    actual = extract_task_from_relay(mod, X86, params, pass_config=config)
    assert_same_extracted_tasks(list(expected), actual)


def test_disabled_pass_and_opt_level_match_upstream() -> None:
    mod, params = load("conv_bias_bn_relu")
    expected = ms.relay_integration.extract_tasks(
        load("conv_bias_bn_relu")[0],
        tvm.target.Target(X86),
        params,
        opt_level=2,
        disabled_pass=["AlterOpLayout"],
    )
    actual = extract_task_from_relay(mod, X86, params, opt_level=2, disabled_pass=["AlterOpLayout"])
    assert_same_extracted_tasks(list(expected), actual)


@pytest.mark.parametrize("target", [X86, CUDA])
def test_linked_params_equal_upstream(target: str) -> None:
    """With relay.FuseOps.link_params the weights are inside the tasks: all values must match."""
    config = {**DEFAULT_PASS_CONFIG, "relay.FuseOps.link_params": True}
    mod, params = load("conv_bias_bn_relu")
    expected = ms.relay_integration.extract_tasks(
        load("conv_bias_bn_relu")[0], tvm.target.Target(target), params, pass_config=config
    )
    assert any(_has_tensor_constant(t) for t in expected), "link_params linked no weights"
    actual = extract_task_from_relay(mod, target, params, pass_config=config)
    assert_same_extracted_tasks(list(expected), actual)


def _has_tensor_constant(task) -> bool:
    found: list[bool] = []
    for func in task.mod.functions.values():
        tvm.relay.analysis.post_order_visit(
            func,
            lambda n: (
                found.append(True)
                if isinstance(n, tvm.relay.Constant) and len(n.data.shape) > 0
                else None
            ),
        )
    return bool(found)
