"""Models from PyTorch, Hugging Face, ONNX exports and TFLite give upstream's tasks, for every
tuner, on x86 and CUDA: the models users actually tune, not only ``tvm.relay.testing``'s."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import auto_scheduler, autotvm
from tvm import meta_schedule as ms

import relay_tasks
from relay_tasks import load_model

from checks import (
    assert_ansor_matches,
    assert_autotvm_matches,
    assert_meta_schedule_matches,
    assert_same_extracted_tasks,
    assert_task_file_round_trips,
)
from frontend_models import MUST_SHOW, from_get_network, load, model_rows
from tflite_writer import fully_connected_model
from zoo import CUDA, X86

TARGETS = {"x86": X86, "cuda": CUDA}


def _slow(model: str, target: str) -> bool:
    """Rows in the slow tier for the default run's time (under 15 minutes on a slow host):
    torchvision ResNet-18 traced (the acceptance test in tests/loaders/test_pytorch.py compares
    it three ways; its ONNX export and the zoo's ResNet-18 keep every tuner's rows), the ONNX
    exports on CUDA (the module of their x86 rows, lowered as the PyTorch rows'), and
    SqueezeNet's export (its operators are its PyTorch rows')."""
    return model == "torchvision-resnet18" or (
        model.endswith("-onnx") and (target == CUDA or "squeezenet" in model)
    )


ROWS = [
    pytest.param(
        row.values[0],
        target,
        marks=(*row.marks, pytest.mark.xdist_group(row.values[0]),
               *([pytest.mark.slow] if _slow(row.values[0], target) else [])),
        id=f"{row.values[0]}-{tname}",
    )
    for row in model_rows()
    for tname, target in TARGETS.items()
]  # fmt: skip


@pytest.mark.parametrize(("model", "target"), ROWS)
def test_meta_schedule(model: str, target: str) -> None:
    tasks = assert_meta_schedule_matches(*load(model), target)
    names = " ".join(t.task_name for t in tasks)
    must_show = MUST_SHOW[model.removesuffix("-onnx")]
    assert all(op in names for op in must_show), (must_show, names)


#: The CUDA rows in the slow tier (the default run's time): MetaSchedule's CUDA rows and the
#: zoo's (small graphs and ResNet-18, every tuner) keep CUDA extraction in the default run, and
#: the x86 rows derive every operator these models have.
CUDA_SLOW = [
    pytest.param(*r.values, marks=(*r.marks, pytest.mark.slow) if r.values[1] == CUDA else r.marks,
                 id=r.id) for r in ROWS
]  # fmt: skip


@pytest.mark.parametrize(("model", "target"), CUDA_SLOW)
def test_autotvm(model: str, target: str) -> None:
    assert assert_autotvm_matches(*load(model), target)


@pytest.mark.parametrize(("model", "target"), CUDA_SLOW)
def test_ansor(model: str, target: str) -> None:
    assert assert_ansor_matches(*load(model), target)


@pytest.mark.parametrize(("model", "target"), CUDA_SLOW)
def test_task_files_round_trip(model: str, target: str) -> None:
    assert_task_file_round_trips(*load(model), target)


@pytest.mark.parametrize("target", [X86, CUDA], ids=["x86", "cuda"])
def test_tflite_model(tmp_path, target: str) -> None:
    rng = np.random.default_rng(1)
    path = tmp_path / "fc.tflite"
    path.write_bytes(fully_connected_model(rng.standard_normal((4, 8)), rng.standard_normal(4)))
    mod, params = load_model(path)
    assert assert_meta_schedule_matches(mod, params, target)
    assert assert_autotvm_matches(mod, params, target)
    assert assert_ansor_matches(mod, params, target)


#: A model of ONNX's own backend tests (shipped in the ``onnx`` package): one constant feeds two
#: ``where`` calls of one fused function, one of them inside the cut where our SimplifyExpr ran
#: TVM's pass, the other outside it. TVM's passes copy the constant once for the whole graph, so
#: FuseOps makes one parameter of it; ours had two (an extra buffer in the TIR).
NLLLOSS = "test_nllloss_NCd1d2d3_none_no_weight_negative_ii_expanded"


@pytest.mark.parametrize("target", [X86, CUDA], ids=["x86", "cuda"])
def test_a_constant_two_calls_share_stays_one_parameter(target: str) -> None:
    import onnx

    path = Path(onnx.__file__).parent / "backend/test/data/node" / NLLLOSS / "model.onnx"
    mod, params = load_model(path)
    tasks = assert_meta_schedule_matches(mod, params, target)
    where = next(t for t in tasks if "where" in t.task_name)
    (func,) = where.mod.functions.values()
    assert len(func.params) == 5, func
    assert assert_autotvm_matches(mod, params, target) == []  # no tunable op
    assert_ansor_matches(mod, params, target, include_simple_tasks=True)


#: Upstream's three entry points, read when called (the drop-in replaces them), with what each
#: tuner consumes from the result.
UPSTREAM_ENTRY_POINTS: dict[str, Callable[[tvm.IRModule, dict, Any], Any]] = {
    "meta_schedule": lambda mod, params, target: list(
        ms.relay_integration.extract_tasks(mod, target, params)
    ),
    "autotvm": lambda mod, params, target: [
        (t.name, t.args) for t in autotvm.task.extract_from_program(mod["main"], params, target)
    ],
    "ansor": lambda mod, params, target: [
        (t.workload_key, t.desc, w)
        for t, w in zip(*auto_scheduler.extract_tasks(mod["main"], params, target), strict=True)
    ],
}


@pytest.mark.slow  # a torch conversion and upstream's extraction: 20-45 s a row; the small
# graphs of test_dropin.py check the same binding against upstream in the default run
@pytest.mark.xdist_group("get_network-resnet_18")
@pytest.mark.parametrize("tuner", list(UPSTREAM_ENTRY_POINTS))
def test_upstreams_get_network_through_the_drop_in(tuner: str) -> None:
    """MetaSchedule's own test helper traces ResNet-18 in training mode: its params include
    BatchNorm counters that ``main`` never reads, which upstream ignores; so does the drop-in."""
    mod, params = from_get_network("resnet_18")
    assert any(name.endswith("num_batches_tracked") for name in params)
    extract, target = UPSTREAM_ENTRY_POINTS[tuner], tvm.target.Target(X86)
    expected = extract(mod, params, target)
    with relay_tasks.installed(), warnings.catch_warnings():
        warnings.simplefilter("error", relay_tasks.UnusedParamsWarning)  # upstream says nothing
        actual = extract(from_get_network("resnet_18")[0], params, target)
    assert expected
    if tuner == "meta_schedule":
        assert_same_extracted_tasks(expected, actual)
    else:
        assert actual == expected
