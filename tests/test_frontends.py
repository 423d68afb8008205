"""Models from PyTorch, Hugging Face, ONNX exports and TFLite give upstream's tasks, for every
tuner, on x86 and CUDA: the models users actually tune, not only ``tvm.relay.testing``'s."""

from __future__ import annotations

import numpy as np
import pytest

from relay_tasks import load_model

from checks import assert_ansor_matches, assert_autotvm_matches, assert_meta_schedule_matches
from frontend_models import MUST_SHOW, load, model_rows
from tflite_writer import fully_connected_model
from zoo import CUDA, X86

TARGETS = {"x86": X86, "cuda": CUDA}
ROWS = [
    pytest.param(
        row.values[0],
        target,
        marks=(*row.marks, pytest.mark.xdist_group(row.values[0])),
        id=f"{row.values[0]}-{tname}",
    )
    for row in model_rows()
    for tname, target in TARGETS.items()
]


@pytest.mark.parametrize(("model", "target"), ROWS)
def test_meta_schedule(model: str, target: str) -> None:
    tasks = assert_meta_schedule_matches(*load(model), target)
    names = " ".join(t.task_name for t in tasks)
    must_show = MUST_SHOW[model.removesuffix("-onnx")]
    assert all(op in names for op in must_show), (must_show, names)


@pytest.mark.parametrize(("model", "target"), ROWS)
def test_autotvm(model: str, target: str) -> None:
    assert assert_autotvm_matches(*load(model), target)


@pytest.mark.parametrize(("model", "target"), ROWS)
def test_ansor(model: str, target: str) -> None:
    assert assert_ansor_matches(*load(model), target)


@pytest.mark.parametrize("target", [X86, CUDA], ids=["x86", "cuda"])
def test_tflite_model(tmp_path, target: str) -> None:
    rng = np.random.default_rng(1)
    path = tmp_path / "fc.tflite"
    path.write_bytes(fully_connected_model(rng.standard_normal((4, 8)), rng.standard_normal(4)))
    mod, params = load_model(path)
    assert assert_meta_schedule_matches(mod, params, target)
    assert assert_autotvm_matches(mod, params, target)
    assert assert_ansor_matches(mod, params, target)
