"""A request is made once per public call: the module type-checked once, the target parsed once."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import relay_tasks.request
from relay_tasks import ModelError, extract
from relay_tasks.adapters.autotvm import extract_tasks_from_models
from relay_tasks.optimize.pipeline import PassSettings
from relay_tasks.request import Request

from zoo import X86, load


@pytest.fixture
def conversions(monkeypatch) -> dict[str, int]:
    """How often the request layer converts a module and parses a target."""
    counts = {"module": 0, "target": 0}
    as_module, as_target = relay_tasks.request.as_module, relay_tasks.request.as_target

    def counted_module(mod):
        counts["module"] += 1
        return as_module(mod)

    def counted_target(target):
        counts["target"] += 1
        return as_target(target)

    monkeypatch.setattr(relay_tasks.request, "as_module", counted_module)
    monkeypatch.setattr(relay_tasks.request, "as_target", counted_target)
    return counts


@pytest.mark.parametrize("tuner", ["meta_schedule", "autotvm", "ansor"])
def test_each_tuner_converts_its_inputs_once(tuner: str, conversions: dict[str, int]) -> None:
    mod, params = load("conv_bias_bn_relu")
    assert extract(mod, X86, params, tuner=tuner)
    assert conversions == {"module": 1, "target": 1}


def test_several_models_parse_the_target_once(conversions: dict[str, int]) -> None:
    (a, pa), (b, pb) = load("conv_bias_bn_relu"), load("dense_softmax")
    assert extract_tasks_from_models([a, b], X86, [pa, pb])
    assert conversions == {"module": 2, "target": 1}


def test_another_model_keeps_target_and_settings_and_checks_its_own_params() -> None:
    mod, params = load("dense_softmax")
    settings = PassSettings(opt_level=2)
    first = Request.of(mod, X86, params, settings, target_host=X86)
    other_mod, other_params = load("conv_bias_bn_relu")
    second = first.with_model(other_mod, other_params)
    assert second.target is first.target and second.settings is first.settings
    assert second.target.host is not None
    assert set(second.params) == set(other_params)
    assert isinstance(next(iter(second.params.values())), tvm.nd.NDArray)
    with pytest.raises(ModelError, match="none of the 1 param\\(s\\) match a parameter of main"):
        first.with_model(other_mod, {"not_a_param": np.zeros(1, "float32")})
