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
from relay_tasks import ir
from relay_tasks.adapters.ansor import default_hardware_params
from relay_tasks.adapters.meta_schedule import DEFAULT_PASS_CONFIG
from relay_tasks.inputs import as_module
from relay_tasks.ir import (
    _SHARED_FUNCTIONS as SHARED_FUNCTIONS,
)
from relay_tasks.ir import (
    dunders_answered_in_python,
    node_key,
    reads_of,
    reads_shared,
)
from relay_tasks.optimize.pipeline import PassSettings, extraction_scope, optimize

from zoo import CUDA, X86, load


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


def test_direct_reads_give_what_the_python_api_gives() -> None:
    x = relay.var("x", shape=(2, 3))
    call = relay.nn.softmax(relay.add(x, relay.const(1.0)), axis=0)
    op, args = ir.call_parts(call)
    assert op.same_as(call.op) and [a.same_as(b) for a, b in zip(args, call.args, strict=True)] == [
        True
    ]
    nullary = relay.Call(relay.Function([], relay.const(1.0)), [])
    assert ir.call_parts(nullary)[1] == [] and ir.items(relay.Tuple([]).fields) == []
    assert len(ir.items(relay.Tuple([x, call, x]).fields)) == 3


def _every_kind() -> list[Any]:
    x = relay.var("x", shape=(2,))
    y = relay.var("y", shape=(2,))
    call = relay.Call(
        tvm.ir.Op.get("nn.softmax"),
        [x],
        tvm.ir.make_node("relay.attrs.SoftmaxAttrs", axis=0),
        span=tvm.ir.Span(tvm.ir.SourceName("m"), 1, 1, 1, 2),
    )
    tup = relay.Tuple([x, call])
    func = relay.Function([x], call).with_attr("Primitive", 1)
    return [
        call,
        tup,
        relay.TupleGetItem(tup, 1),
        func,
        relay.Let(y, x, relay.add(y, y)),
        relay.If(relay.const(True), x, call),
    ]


@pytest.mark.parametrize("index", range(6))
def test_a_node_rebuilt_over_new_children_keeps_every_other_field(index: int) -> None:
    """As TVM's own mutators rebuild: the new children in place, everything else kept."""
    node = _every_kind()[index]
    kids = ir.children(node)
    assert kids is not None
    new = [k if isinstance(k, tvm.ir.Op) else relay.var(f"new{i}") for i, k in enumerate(kids)]
    rebuilt = ir.with_children(node, new)
    assert not rebuilt.same_as(node) and type(rebuilt) is type(node)
    assert all(a.same_as(b) for a, b in zip(ir.children(rebuilt), new, strict=True))
    for name in ("attrs", "type_args", "span", "params", "ret_type", "var", "index"):
        if hasattr(node, name):
            old, got = getattr(node, name), getattr(rebuilt, name)
            plain = old is None or isinstance(old, int)
            assert got == old if plain else old.same_as(got), name
    same = ir.with_children(node, kids)
    assert same.same_as(node)  # nothing new: the node itself, as TVM's WithFields answers


def test_the_ffi_builds_its_unused_pointers_cheaply_only_inside_the_scope() -> None:
    """TVM's Cython FFI casts every returned object's address to a ctypes pointer it drops;
    inside, that pointer is built directly, with the same value, and every other use of ctypes
    by the FFI is ctypes' own."""
    import ctypes
    import sys

    core = sys.modules["tvm._ffi._cy3.core"]
    assert core.ctypes is ctypes
    x = relay.var("x", shape=(2,))
    call = relay.add(x, x)
    with ir.pointers_made_cheaply(), ir.pointers_made_cheaply():
        assert core.ctypes is not ctypes and core.ctypes.c_void_p is ctypes.c_void_p
        for address in (0, 1, 2**47 + 8):
            assert (
                core.ctypes.cast(address, ctypes.c_void_p).value == ctypes.c_void_p(address).value
            )
        buffer = ctypes.create_string_buffer(b"relay")
        assert core.ctypes.cast(buffer, ctypes.c_char_p).value == b"relay"  # ctypes' own
        assert call.op.handle.value == node_key(call.op)  # handles still point at the node
        saved = relay.save_param_dict({"w": tvm.nd.array(np.arange(3, dtype="float32"))})
        assert relay.load_param_dict(saved)["w"].numpy().tolist() == [0, 1, 2]  # bytes returns
    assert core.ctypes is ctypes


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


def _functions(count: int) -> list[relay.Function]:
    x = relay.var("x", shape=(2,))
    return [relay.Function([x], relay.add(x, relay.const(float(i)))) for i in range(count)]


def test_reads_are_shared_per_function_only_inside_the_scope() -> None:
    func = _functions(1)[0]
    reads = reads_of(func)
    call = reads.nodes[-2]  # the add, just before the function itself
    assert isinstance(call, relay.Call) and reads.op_name(call) == "add"
    assert reads.args(call)[0].same_as(func.params[0])
    assert reads.children(call)[0].same_as(call.op)
    assert reads_of(func) is not reads  # nothing is kept outside the scope
    with reads_shared():
        shared = reads_of(func)
        assert reads_of(func) is shared
        assert reads_of(relay.Function(func.params, func.body)) is not shared  # another node
        assert reads_of(tvm.IRModule.from_expr(func)["main"]) is shared  # another handle
    assert reads_of(func) is not shared


def test_shared_reads_let_older_functions_go() -> None:
    """Only the functions met last are kept, with what they hold (the pipeline meets one
    function at a time, and old versions hold constants nothing else needs)."""
    funcs = _functions(SHARED_FUNCTIONS + 1)
    with reads_shared():
        first = reads_of(funcs[0])
        for func in funcs[1:]:
            reads_of(func)
        assert reads_of(funcs[-1]) is reads_of(funcs[-1])
        assert reads_of(funcs[0]) is not first


def test_an_unchanged_function_is_read_once_by_the_whole_pipeline(monkeypatch) -> None:
    """Gates, folds and screens that meet ``main`` unchanged read it once between them."""
    from relay_tasks import ir

    built: list[ir.FunctionReads] = []
    original = ir.FunctionReads.__init__

    def counted(self: ir.FunctionReads, func: relay.Function) -> None:
        original(self, func)
        built.append(self)

    monkeypatch.setattr(ir.FunctionReads, "__init__", counted)
    mod, params = load("dense_softmax")
    with extraction_scope(tvm.target.Target(X86), PassSettings(config=dict(DEFAULT_PASS_CONFIG))):
        optimize(as_module(mod), params)
    assert built
    for i, reads in enumerate(built):
        assert not any(reads.func.same_as(later.func) for later in built[i + 1 :])
