"""Many models at once: one task list, equal tasks merged."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import relay_tasks
from relay_tasks.api import extract_models

from small_graphs import _module, _weights
from zoo import X86


def _block(seed: int, extra: bool) -> tuple[tvm.IRModule, dict]:
    """A model with a shared first layer; ``extra`` adds a layer only this model has."""
    rng = np.random.default_rng(seed)
    data = relay.var("data", shape=(1, 16, 14, 14))
    w = relay.var("w", shape=(16, 16, 3, 3))
    out = relay.nn.relu(relay.nn.conv2d(data, w, padding=(1, 1), channels=16, kernel_size=(3, 3)))
    shapes = {"w": (16, 16, 3, 3)}
    if extra:
        w2 = relay.var("w2", shape=(32, 16, 1, 1))
        out = relay.nn.conv2d(out, w2, channels=32, kernel_size=(1, 1))
        shapes["w2"] = (32, 16, 1, 1)
    return _module(out), _weights(rng, **shapes)


@pytest.mark.parametrize("tuner", ["meta_schedule", "autotvm", "ansor"])
def test_two_models_sharing_a_layer_give_one_task_with_summed_weight(tuner: str) -> None:
    a, b = _block(1, extra=False), _block(2, extra=True)
    single_a = relay_tasks.extract(*a[:1], X86, a[1], tuner=tuner)
    single_b = relay_tasks.extract(*b[:1], X86, b[1], tuner=tuner)
    merged = extract_models([("a", *a), ("b", *b)], X86, tuner=tuner)
    shared = {t.key for t in single_a} & {t.key for t in single_b}
    assert shared, "the models share no task; the test would prove nothing"
    assert [t.key for t in merged] == list(dict.fromkeys(t.key for t in single_a + single_b))
    weight_a = {t.key: t.weight for t in single_a}
    weight_b = {t.key: t.weight for t in single_b}
    for task in merged:
        assert task.weight == weight_a.get(task.key, 0) + weight_b.get(task.key, 0)
        assert task.models == tuple(
            m for m, w in (("a", weight_a), ("b", weight_b)) if task.key in w
        )
    if tuner == "meta_schedule":
        assert all(t.native.weight == t.weight for t in merged)
