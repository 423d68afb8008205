"""Modules shaped the way frontends write them, beyond one ``main`` of tensor ops.

The PyTorch frontend imports the Relay Prelude (type definitions and dozens of global functions)
into every module; TensorFlow and PyTorch control flow becomes ``If`` and let-bound recursive
functions (``relay.loops.while_loop``); optional and list inputs become ADT values; graphs pass
tuples in and out. Each builder returns ``(IRModule, params)`` with tunable ops placed inside
those constructs, so a backend that skips them misses tasks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relay
from tvm.relay import loops
from tvm.relay.prelude import Prelude

Model = tuple[tvm.IRModule, dict[str, np.ndarray]]
RNG = np.random.default_rng(5)


def _weights(**shapes: tuple[int, ...]) -> tuple[dict[str, relay.Var], dict[str, np.ndarray]]:
    variables = {name: relay.var(name, shape=shape) for name, shape in shapes.items()}
    values = {name: RNG.standard_normal(shape).astype("float32") for name, shape in shapes.items()}
    return variables, values


def _conv_relu(data: relay.Expr, w: relay.Var) -> relay.Expr:
    return relay.nn.relu(relay.nn.conv2d(data, w, padding=(1, 1), channels=8, kernel_size=(3, 3)))


def _with_main(mod: tvm.IRModule, body: relay.Expr, params: list[relay.Var]) -> tvm.IRModule:
    mod["main"] = relay.Function(params, body)
    return relay.transform.InferType()(mod)


def _add_global(
    mod: tvm.IRModule, name: str, params: list[relay.Var], body: relay.Expr
) -> relay.GlobalVar:
    """Add a global function with its return type spelled out: type inference checks each
    global function on its own, so a caller needs its callee's type annotated (frontends do)."""
    typed = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body)))
    gvar = relay.GlobalVar(name)
    mod[gvar] = relay.Function(params, body, ret_type=typed["main"].ret_type)
    return gvar


def prelude_imported() -> Model:
    """A convolution net in a module that also holds the Prelude, as from_pytorch returns it."""
    mod = tvm.IRModule()
    Prelude(mod)
    data = relay.var("data", shape=(1, 3, 16, 16))
    variables, params = _weights(w=(8, 3, 3, 3))
    body = relay.nn.global_avg_pool2d(_conv_relu(data, variables["w"]))
    return _with_main(mod, body, [data, *variables.values()]), params


def prelude_list_in_main() -> Model:
    """``main`` builds a Prelude ``List`` of tensors and calls Prelude functions on it."""
    mod = tvm.IRModule()
    prelude = Prelude(mod)
    data = relay.var("data", shape=(1, 16))
    variables, params = _weights(w=(32, 16), v=(32, 32))
    first = relay.nn.relu(relay.nn.dense(data, variables["w"]))
    second = relay.tanh(relay.nn.dense(first, variables["v"]))
    _, cons, nil = mod.get_type("List")
    items = cons(first, cons(second, nil()))
    head = prelude.hd(prelude.rev(items))
    body = relay.nn.softmax(head)
    return _with_main(mod, body, [data, *variables.values()]), params


def several_global_functions() -> Model:
    """``main`` calls a global ``block`` twice and a global ``head``; an unused global too."""
    mod = tvm.IRModule()
    variables, params = _weights(w1=(8, 3, 3, 3), w2=(8, 8, 3, 3), wd=(10, 8))
    x, w = relay.var("x", shape=(1, 8, 8, 8)), relay.var("w", shape=(8, 8, 3, 3))
    block = _add_global(mod, "block", [x, w], _conv_relu(x, w))
    y, wd = relay.var("y", shape=(1, 8, 8, 8)), relay.var("wd", shape=(10, 8))
    pooled = relay.nn.batch_flatten(relay.nn.global_avg_pool2d(y))
    head = _add_global(mod, "head", [y, wd], relay.nn.softmax(relay.nn.dense(pooled, wd)))
    z = relay.var("z", shape=(1, 4, 4))
    _add_global(mod, "unused", [z], relay.nn.batch_matmul(z, z))
    data = relay.var("data", shape=(1, 3, 8, 8))
    out = _conv_relu(data, variables["w1"])
    out = relay.Call(block, [out, variables["w2"]])
    out = relay.Call(block, [out, variables["w2"]])
    body = relay.Call(head, [out, variables["wd"]])
    return _with_main(mod, body, [data, *variables.values()]), params


def while_loop() -> Model:
    """A let-bound recursive function: three rounds of dense + tanh, then a softmax."""
    variables, params = _weights(w=(16, 16))
    data = relay.var("data", shape=(1, 16))
    i = relay.var("i", shape=(), dtype="int32")
    h = relay.var("h", shape=(1, 16))

    def cond(i: relay.Expr, h: relay.Expr) -> relay.Expr:
        return relay.less(i, relay.const(3, "int32"))

    def body(i: relay.Expr, h: relay.Expr) -> list[relay.Expr]:
        return [i + relay.const(1, "int32"), relay.tanh(relay.nn.dense(h, variables["w"]))]

    loop = loops.while_loop(cond, [i, h], body)
    result = loop(relay.const(0, "int32"), relay.nn.relu(data))
    out = relay.nn.softmax(relay.TupleGetItem(result, 1))
    return _with_main(tvm.IRModule(), out, [data, *variables.values()]), params


def _pooling_heads(flag: relay.Expr, features: relay.Expr) -> relay.Expr:
    """``If`` ``flag``: a 2x2 max-pool, else a 2x2 avg-pool."""
    return relay.If(
        flag,
        relay.nn.max_pool2d(features, pool_size=(2, 2), strides=(2, 2)),
        relay.nn.avg_pool2d(features, pool_size=(2, 2), strides=(2, 2)),
    )


def if_then_else() -> Model:
    """An ``If`` on a scalar input chooses between a max-pool and an avg-pool head."""
    variables, params = _weights(w=(8, 3, 3, 3))
    data = relay.var("data", shape=(1, 3, 16, 16))
    flag = relay.var("flag", shape=(), dtype="bool")
    branch = _pooling_heads(flag, _conv_relu(data, variables["w"]))
    return _with_main(tvm.IRModule(), relay.exp(branch), [data, flag, *variables.values()]), params


def control_flow() -> Model:
    """conv2d + relu, an ``If`` between two pooling heads, then a while loop of dense + tanh."""
    variables, params = _weights(w=(8, 3, 3, 3), wd=(128, 128))
    data = relay.var("data", shape=(1, 3, 8, 8))
    flag = relay.var("flag", shape=(), dtype="bool")
    pooled = _pooling_heads(flag, _conv_relu(data, variables["w"]))
    i, h = relay.var("i", shape=(), dtype="int32"), relay.var("h", shape=(1, 128))
    loop = loops.while_loop(
        lambda i, h: relay.less(i, relay.const(2, "int32")),
        [i, h],
        lambda i, h: [i + relay.const(1, "int32"), relay.tanh(relay.nn.dense(h, variables["wd"]))],
    )
    result = loop(relay.const(0, "int32"), relay.reshape(pooled, (1, 128)))
    body = relay.TupleGetItem(result, 1)
    return _with_main(tvm.IRModule(), body, [data, flag, *variables.values()]), params


def dynamic_while_loop() -> Model:
    """A convolution on a static input beside a while loop over a tensor whose shape is known
    only at run time (flattened by a ``dyn.reshape``): the VM sizes storage at run time in
    ``main`` and in the lifted loop body. Found by the fuzzer: on such modules upstream's Ansor
    order follows object addresses and varies between calls (the check accepts any of its
    answers)."""
    variables, params = _weights(w=(8, 3, 3, 3))
    data = relay.var("data", shape=(1, 3, 8, 8))
    seq = relay.var("seq", shape=(2, 4, relay.Any(), relay.Any()))
    batch = relay.strided_slice(relay.shape_of(seq, "int64"), begin=[0], end=[1])
    shape = relay.concatenate([batch, relay.const([-1], "int64")], axis=0)
    flat = relay.reshape(relay.nn.relu(seq), shape)
    i = relay.var("i", shape=(), dtype="int32")
    h = relay.var("h", shape=(relay.Any(), relay.Any()))
    loop = loops.while_loop(
        lambda i, h: relay.less(i, relay.const(3, "int32")),
        [i, h],
        lambda i, h: [i + relay.const(1, "int32"), relay.exp(h)],
    )
    looped = relay.TupleGetItem(loop(relay.const(0, "int32"), flat), 1)
    body = relay.Tuple([_conv_relu(data, variables["w"]), looped])
    return _with_main(tvm.IRModule(), body, [data, seq, *variables.values()]), params


def tuples_in_and_out() -> Model:
    """A tuple-typed input and a tuple output, as frontends pass (hidden, cell) states."""
    variables, params = _weights(w=(16, 16))
    state = relay.var(
        "state", relay.TupleType([relay.TensorType((1, 16)), relay.TensorType((1, 16))])
    )
    hidden, cell = relay.TupleGetItem(state, 0), relay.TupleGetItem(state, 1)
    new_cell = relay.sigmoid(relay.nn.dense(hidden, variables["w"])) * cell
    new_hidden = relay.tanh(new_cell)
    body = relay.Tuple([new_hidden, new_cell])
    return _with_main(tvm.IRModule(), body, [state, *variables.values()]), params


def optional_and_list_inputs() -> Model:
    """An ``Option`` input matched in ``main`` and a ``List`` input folded over, as the PyTorch
    frontend writes ``Optional[Tensor]`` and ``List[Tensor]`` arguments."""
    mod = tvm.IRModule()
    prelude = Prelude(mod)
    variables, params = _weights(w=(16, 16))
    tensor = relay.TensorType((1, 16))
    option, some_ctor, none_ctor = mod.get_type("Option")
    list_type = mod.get_type("List")[0]
    bias = relay.var("bias", option(tensor))
    items = relay.var("items", list_type(tensor))
    data = relay.var("data", shape=(1, 16))
    hidden = relay.nn.relu(relay.nn.dense(data, variables["w"]))
    value = relay.var("value", tensor)
    with_bias = relay.Match(
        bias,
        [
            relay.Clause(
                relay.PatternConstructor(some_ctor, [relay.PatternVar(value)]), hidden + value
            ),
            relay.Clause(relay.PatternConstructor(none_ctor, []), hidden),
        ],
    )
    acc, item = relay.var("acc", tensor), relay.var("item", tensor)
    summed = prelude.foldl(
        relay.Function([acc, item], relay.tanh(relay.nn.dense(acc + item, variables["w"]))),
        with_bias,
        items,
    )
    return _with_main(
        mod, relay.nn.softmax(summed), [data, bias, items, *variables.values()]
    ), params


def unreachable_dynamic_global() -> Model:
    """A convolution in ``main`` beside a global function of dynamic shape whose one call
    folds away: ``main`` keeps only the shape of its result's shape (static, so folded). The VM
    compiler lowers the global function, but its memory planning drops it first, so it adds no
    storage-size functions for it (Ansor's ``prod``). Found by the fuzzer on CUDA."""
    variables, params = _weights(w=(8, 3, 3, 3))
    data = relay.var("data", shape=(1, 3, 8, 8))
    seq = relay.var("seq", shape=(relay.Any(), 4, 8))
    a0 = relay.var("a0", shape=(relay.Any(), 4, 8))
    mod = tvm.IRModule()
    f1 = _add_global(mod, "f1", [a0], relay.nn.relu(a0))
    shape = relay.shape_of(relay.cast(relay.shape_of(f1(seq), "int32"), "float32"), "int32")
    body = relay.Tuple([_conv_relu(data, variables["w"]), relay.cast(shape, "float32")])
    return _with_main(mod, body, [data, seq, *variables.values()]), params


MODULE_SHAPES: dict[str, Callable[[], Model]] = {
    f.__name__: f
    for f in (
        prelude_imported,
        prelude_list_in_main,
        several_global_functions,
        while_loop,
        if_then_else,
        control_flow,
        dynamic_while_loop,
        tuples_in_and_out,
        optional_and_list_inputs,
        unreachable_dynamic_global,
    )
}
#: Ops each model's MetaSchedule tasks (in ``main``) must show, so no row passes on nothing.
MUST_SHOW = {
    "prelude_imported": ("conv2d",),
    "prelude_list_in_main": ("dense", "softmax"),
    "several_global_functions": ("conv2d",),
    "while_loop": ("softmax",),
    "if_then_else": ("conv2d", "max_pool2d", "avg_pool2d"),
    "control_flow": ("conv2d", "max_pool2d", "avg_pool2d"),
    "dynamic_while_loop": ("conv2d",),
    "tuples_in_and_out": ("dense",),
    "optional_and_list_inputs": ("dense", "softmax"),
    "unreachable_dynamic_global": ("conv2d",),
}
#: Modules with several global functions whose Ansor order upstream gives the same on every
#: call (measured: 6 calls each on x86, cuda and aarch64): built by inserting at most four
#: functions, their maps keep insertion order. (See ``checks._order_follows_addresses``.)
STABLE_ANSOR_ORDER = frozenset({"several_global_functions", "while_loop", "control_flow"})
#: Modules upstream's VM compiler (behind AutoTVM and Ansor extraction) rejects after fusion.
VM_REJECTS = frozenset({"prelude_list_in_main"})
