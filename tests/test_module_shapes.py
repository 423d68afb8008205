"""Every shape of module a frontend writes extracts as upstream's extractors do, for all three
tuners: the Prelude's ADTs, several global functions, loops, ``If``, tuples, optional and list
inputs (see ``module_shapes.py``), and params given as the ``tvm.ir.Map`` that
``relay.load_param_dict`` returns."""

from __future__ import annotations

import pytest
import tvm
from tvm import relay

import relay_tasks
from relay_tasks import ExtractionError
from relay_tasks.adapters.meta_schedule import extract_task_from_relay

import oracles
from checks import (
    assert_ansor_matches,
    assert_autotvm_matches,
    assert_meta_schedule_matches,
    assert_same_extracted_tasks,
)
from module_shapes import MODULE_SHAPES, MUST_SHOW, STABLE_ANSOR_ORDER, VM_REJECTS
from zoo import AARCH64, CUDA, X86, copy_module

TARGETS = {"x86": X86, "cuda": CUDA, "aarch64": AARCH64}
ROWS = [
    pytest.param(model, target, id=f"{model}-{name}")
    for model in MODULE_SHAPES
    for name, target in TARGETS.items()
]


@pytest.mark.parametrize(("model", "target"), ROWS)
def test_meta_schedule(model: str, target: str) -> None:
    tasks = assert_meta_schedule_matches(*MODULE_SHAPES[model](), target)
    names = " ".join(t.task_name for t in tasks)
    assert all(op in names for op in MUST_SHOW[model]), names


@pytest.mark.parametrize(("model", "target"), ROWS)
def test_autotvm(model: str, target: str) -> None:
    tasks = assert_autotvm_matches(*MODULE_SHAPES[model](), target)
    assert bool(tasks) != (model in VM_REJECTS)


@pytest.mark.parametrize("simple", [False, True], ids=["complex-only", "with-simple"])
@pytest.mark.parametrize(("model", "target"), ROWS)
def test_ansor(model: str, target: str, simple: bool) -> None:
    exact = model in STABLE_ANSOR_ORDER or None
    tasks = assert_ansor_matches(*MODULE_SHAPES[model](), target, simple, exact_order=exact)
    assert bool(tasks) != (model in VM_REJECTS)


@pytest.mark.parametrize("model", sorted(VM_REJECTS))
def test_where_the_vm_compiler_rejects_a_module_the_compiling_tuners_say_so(model: str) -> None:
    """Upstream's AutoTVM and Ansor compile the model with the VM compiler, whose type checker
    rejects Prelude functions used at a concrete type after lambda lifting; ours runs the same
    passes and raises one ExtractionError. MetaSchedule never compiles and extracts it."""
    mod, params = MODULE_SHAPES[model]()
    with pytest.raises(oracles.UpstreamFailed):
        oracles.ansor_tasks_of(copy_module(mod), params, X86)
    message = r"TVM's VM compiler, which AutoTVM and Ansor extract with, rejects the model"
    with pytest.raises(ExtractionError, match=message):
        relay_tasks.autotvm.extract_tasks(copy_module(mod), X86, params)
    with pytest.raises(ExtractionError, match="does not match"):
        relay_tasks.ansor.extract_tasks(copy_module(mod), X86, params)
    assert extract_task_from_relay(copy_module(mod), X86, params)


def test_functions_only_other_globals_call_are_tasks_of_the_compiling_tuners() -> None:
    """``block`` and ``head`` are global functions ``main`` calls; upstream's MetaSchedule
    extraction walks ``main`` only, the VM compiler behind AutoTVM and Ansor lowers them all.
    A function called twice from ``main`` is lowered once, so its Ansor weight is 1."""
    mod, params = MODULE_SHAPES["several_global_functions"]()
    meta = [t.task_name for t in extract_task_from_relay(copy_module(mod), CUDA, params)]
    assert not any("dense" in name for name in meta), meta
    autotvm = [t.name for t in relay_tasks.autotvm.extract_tasks(copy_module(mod), CUDA, params)]
    assert "dense_small_batch.gpu" in autotvm
    searches, weights = relay_tasks.ansor.extract_tasks(
        copy_module(mod), CUDA, params, hardware_params=oracles.hardware_params(CUDA)
    )
    by_desc = dict(zip((t.desc for t in searches), weights, strict=True))
    # Two convolutions of different shapes (main's, block's): each lowered once, weight 1.
    assert by_desc == {
        "vm_mod_fused_nn_conv2d_nn_relu": 1,
        "vm_mod_fused_nn_conv2d_nn_relu_1": 1,
        "vm_mod_fused_nn_global_avg_pool2d": 1,
        "vm_mod_fused_nn_dense": 1,
        "vm_mod_fused_nn_softmax": 1,
    }


def test_the_callers_module_keeps_its_type_definitions() -> None:
    mod, params = MODULE_SHAPES["optional_and_list_inputs"]()
    before = len(mod.type_definitions)
    relay_tasks.extract_tasks(mod, X86, params)
    assert len(mod.type_definitions) == before > 0
    assert len(mod["main"].params) == 4  # the weights were not bound into the caller's module


@pytest.mark.parametrize("target", [X86, CUDA])
def test_params_as_a_tvm_map(target: str) -> None:
    """``relay.load_param_dict`` returns a ``tvm.ir.Map``; upstream accepts it, so does ours,
    in every entry point, the drop-in included."""
    mod, params = MODULE_SHAPES["prelude_imported"]()
    loaded = relay.load_param_dict(relay.save_param_dict(params))
    assert isinstance(loaded, tvm.ir.container.Map)
    expected = assert_meta_schedule_matches(mod, params, target)
    assert_same_extracted_tasks(expected, extract_task_from_relay(copy_module(mod), target, loaded))
    with relay_tasks.installed():
        from tvm import meta_schedule as ms

        dropped_in = ms.relay_integration.extract_tasks(copy_module(mod), target, loaded)
    assert_same_extracted_tasks(expected, list(dropped_in))
    autotvm = relay_tasks.autotvm.extract_tasks(copy_module(mod), target, loaded)
    assert [(t.name, t.args) for t in autotvm] == assert_autotvm_matches(mod, params, target)
    searches, weights = relay_tasks.ansor.extract_tasks(
        copy_module(mod), target, loaded, hardware_params=oracles.hardware_params(target)
    )
    assert [(t.workload_key, t.desc, w) for t, w in zip(searches, weights, strict=True)] == (
        assert_ansor_matches(mod, params, target)
    )
