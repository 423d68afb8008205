"""TVM IR helpers: node keys, attribute patches, the dunder answer for TOPI's numpy probes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.runtime import Object
from tvm.runtime import object as tvm_object

import relay_tasks
from relay_tasks.adapters.ansor import default_hardware_params
from relay_tasks.ir import dunders_answered_in_python, node_key

from zoo import CUDA


def test_node_keys_name_nodes_not_python_handles() -> None:
    """Every handle of one node has one key (the node's address); two live nodes never share
    one, whatever their kind."""
    x = relay.var("x", shape=(2,))
    call = relay.add(x, relay.const(1.0))
    func = relay.Function([x], relay.Tuple([call, relay.TupleGetItem(relay.Tuple([x]), 0)]))
    mod = tvm.IRModule.from_expr(func)
    nodes: list[object] = []
    relay.analysis.post_order_visit(mod["main"], nodes.append)
    nodes += [mod.get_global_var("main"), call.args]  # and the op, visited above
    assert [node_key(n) for n in nodes] == [n.handle.value for n in nodes]
    assert len({node_key(n) for n in nodes}) == len(nodes)
    again = mod["main"].body.fields[0]
    assert again is not mod["main"].body.fields[0]  # a new Python handle on each read...
    assert node_key(again) == node_key(mod["main"].body.fields[0])  # ...for one node


def _lookup_error(lookup: Any) -> str:
    with pytest.raises(AttributeError) as error:
        lookup()
    return str(error.value)


def test_dunder_probes_are_answered_without_tvm_and_only_inside_the_scope() -> None:
    var = tvm.te.var("n")
    real = Object.__getattr__
    missing = [lambda: var.no_such_field, lambda: Object.__getattr__(var, "handle")]
    outside = [_lookup_error(lookup) for lookup in missing]
    with pytest.raises(RuntimeError), dunders_answered_in_python():
        assert not hasattr(var, "__array_interface__")
        assert var.name == "n" and var.dtype == "int32"  # fields still come from TVM
        assert [_lookup_error(lookup) for lookup in missing] == outside  # and fail as in TVM
        raise RuntimeError
    assert Object.__getattr__ is real


@pytest.mark.parametrize("tuner", ["meta_schedule", "autotvm", "ansor"])
def test_cuda_templates_probe_no_dunder_in_tvm(tuner: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """TOPI's CUDA convolution puts TE variables in numpy arrays, in the lowering and again
    when the tuner's task is made; none of numpy's probes reaches TVM's C++ (whose first error
    would cost 0.14 s of backtrace symbols)."""
    asked: list[str] = []
    lookup = tvm_object._ffi_node_api.NodeGetAttr
    monkeypatch.setattr(
        tvm_object._ffi_node_api,
        "NodeGetAttr",
        lambda obj, name: asked.append(name) or lookup(obj, name),
    )
    x = relay.var("x", shape=(1, 16, 14, 14))
    w = relay.var("w", shape=(16, 16, 3, 3))
    # Channels and kernel size given: MetaSchedule's winograd layout for CUDA needs them.
    conv = relay.nn.conv2d(x, w, padding=(1, 1), channels=16, kernel_size=(3, 3))
    mod = tvm.IRModule.from_expr(relay.Function([x, w], conv))
    params = {"w": np.zeros((16, 16, 3, 3), "float32")}
    target = tvm.target.Target(CUDA)
    if tuner == "meta_schedule":
        tasks = relay_tasks.meta_schedule.extract_task_from_relay(mod, target, params)
    elif tuner == "autotvm":
        tasks = relay_tasks.autotvm.extract_tasks(mod, target, params)
    else:
        hardware = default_hardware_params(target)
        tasks, _ = relay_tasks.ansor.extract_tasks(mod, target, params, hardware_params=hardware)
    assert tasks and asked
    assert not [name for name in asked if name.startswith("__")]
