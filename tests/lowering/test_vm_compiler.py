"""The VM compiler's lowering order: the shortcut for dataflow-only modules gives what the
compiler's own passes give, and control flow takes the long way."""

from __future__ import annotations

import pytest
import tvm
from tvm import relay

from relay_tasks.inputs import as_module, as_params
from relay_tasks.lowering.vm_compiler import (
    _straight_line_calls,
    calls_after_passes,
    compiler_calls,
)
from relay_tasks.optimize.pipeline import PassSettings, extraction_scope, optimize

from module_shapes import MODULE_SHAPES
from small_graphs import SMALL_GRAPHS
from zoo import CUDA, X86, load


def _fused(mod: tvm.IRModule, params: dict, target: str) -> tvm.IRModule:
    module = as_module(mod)
    with extraction_scope(tvm.target.Target(target), PassSettings()):
        return optimize(module, as_params(params, module))


def _keys(calls: list) -> list[tuple[int, bool]]:
    """Each call's function (by structural hash) and whether memory planning sees it; the
    shortcut's plain functions are all in ``main``, so all planned."""
    return [
        (int(tvm.ir.structural_hash(c)), True)
        if isinstance(c, relay.Function)
        else (int(tvm.ir.structural_hash(c.func)), c.planned)
        for c in calls
    ]


@pytest.mark.parametrize("target", [X86, CUDA], ids=["x86", "cuda"])
@pytest.mark.parametrize("model", ["resnet-18", *SMALL_GRAPHS])
def test_the_shortcut_equals_the_compilers_passes_on_dataflow_models(model: str, target: str):
    fused = _fused(*load(model), target)
    shortcut = _straight_line_calls(fused["main"])
    assert shortcut is not None, "a dataflow model should take the shortcut"
    with extraction_scope(tvm.target.Target(target), PassSettings()):
        assert _keys(shortcut) == _keys(calls_after_passes(fused))


@pytest.mark.parametrize(
    "model", ["if_then_else", "while_loop", "several_global_functions", "optional_and_list_inputs"]
)
def test_control_flow_and_global_functions_take_the_long_way(model: str) -> None:
    fused = _fused(*MODULE_SHAPES[model](), X86)
    assert len(fused.functions) > 1 or _straight_line_calls(fused["main"]) is None
    with extraction_scope(tvm.target.Target(X86), PassSettings()):
        assert _keys(compiler_calls(fused)) == _keys(calls_after_passes(fused))
