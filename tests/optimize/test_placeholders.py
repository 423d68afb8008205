"""Deferred fold results: computed when something reads them, never lowered unfilled."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relay

from relay_tasks.adapters.meta_schedule import DEFAULT_PASS_CONFIG
from relay_tasks.inputs import as_module
from relay_tasks.optimize import evaluate, fold
from relay_tasks.optimize.pipeline import PassSettings, extraction_scope, optimize

from checks import assert_meta_schedule_matches, fold_both
from zoo import X86


def test_deferred_results_are_computed_when_something_reads_them() -> None:
    w = np.random.default_rng(2).standard_normal((64, 128)).astype("float32")
    chain = relay.transpose(relay.reshape(relay.const(w), (128, 64)))  # both large: deferred
    func = relay.Function([], relay.exp(chain))  # exp is TVM's to fold: it reads the chain
    ours, theirs = fold_both(func)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])


def test_deferred_results_that_nothing_reads_are_never_computed(monkeypatch) -> None:
    calls: list[str] = []
    real = evaluate.EVALUATORS["reshape"]
    monkeypatch.setitem(
        evaluate.EVALUATORS, "reshape", lambda a, x: calls.append("r") or real(a, x)
    )
    w = np.random.default_rng(3).standard_normal((64, 128)).astype("float32")
    x = relay.var("x", shape=(128, 64))
    func = relay.Function([x], relay.add(x, relay.reshape(relay.const(w), (128, 64))))
    ours, theirs = fold_both(func, read=False)
    folded, upstream = ours["main"].body.args[1], theirs["main"].body.args[1]
    assert isinstance(folded, relay.Constant)
    assert folded.data.shape == upstream.data.shape and folded.data.dtype == upstream.data.dtype
    assert calls == []  # the fold left the value of a fused function's argument alone
    small = relay.Function([x], relay.add(x, relay.reshape(relay.const(w[:1, :64]), (64,))))
    fold_both(small, read=False)
    assert calls == ["r"]  # small results are computed as usual
    # Outside the pipeline's guard nothing is deferred: a lone FoldConstant computes it all.
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    with tvm.transform.PassContext(opt_level=3):
        fold.FoldConstant()(mod)
    assert calls == ["r", "r"]


def test_placeholders_are_tracked_until_filled_and_the_size_bound_is_inclusive() -> None:
    """Each deferred result is listed as unfilled while the guard is open, and leaves the list
    when something reads it; exactly DEFER_MIN_ELEMENTS elements is large enough to defer."""
    from relay_tasks.optimize.fold import FoldConstant
    from relay_tasks.optimize.placeholders import (
        DEFER_MIN_ELEMENTS,
        deferred_placeholders,
        filled_data,
    )

    side = int(DEFER_MIN_ELEMENTS**0.5)
    assert side * side == DEFER_MIN_ELEMENTS
    w = np.random.default_rng(4).standard_normal((side, side)).astype("float32")
    x = relay.var("x", shape=(side, side))
    func = relay.Function([x], relay.exp(relay.transpose(relay.const(w))) + x)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    with tvm.transform.PassContext(opt_level=3), deferred_placeholders() as unfilled:
        exp = FoldConstant()(mod)["main"].body.args[0]  # exp's kernel waits for the transpose
        assert [tuple(c.data.shape) for c in unfilled.values()] == [(side, side)] * 2
        value = filled_data(exp).numpy()
        assert unfilled == {}  # reading exp computed the transpose first
    theirs = relay.transform.FoldConstant()(mod)["main"].body.args[0].data.numpy()
    assert np.array_equal(value.view("uint32"), theirs.view("uint32"))  # TVM's own exp
    y = relay.var("y", shape=(side - 1, side))
    smaller = relay.Function([y], relay.add(y, relay.transpose(relay.const(w[:, 1:]))))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(smaller))
    with tvm.transform.PassContext(opt_level=3), deferred_placeholders() as unfilled:
        FoldConstant()(mod)
        assert unfilled == {}


@pytest.mark.parametrize(
    ("values", "reader"),
    [
        # numpy declines NaN: the deferred value is TVM's to compute when exp reads it
        (np.full((64, 64), np.nan, "float32"), lambda c: relay.exp(c)),
        # an int32 placeholder is int32 before it is filled
        (
            np.arange(4096, dtype="int32").reshape(64, 64),
            lambda c: relay.left_shift(c, relay.const(1, "int32")),
        ),
    ],
)
def test_deferred_results_keep_their_type_and_fall_back_to_tvm(values, reader) -> None:
    """Read by an op TVM folds (so the placeholder is filled first), the value is TVM's."""
    func = relay.Function([], reader(relay.transpose(relay.const(values))))
    ours, theirs = fold_both(func)
    assert tvm.ir.structural_equal(ours["main"], theirs["main"])


def test_placeholders_inside_fused_functions_are_computed_and_no_others() -> None:
    """Lowering reads the constants inside primitive functions: those placeholders (found by
    buffer: FuseOps rebuilds the nodes around the same arrays) are computed once the module is
    fused; one that is only a fused function's argument stays unread."""
    from relay_tasks.optimize.placeholders import current, deferred_placeholders, fill_inside_tasks

    inside, outside = (relay.Constant(tvm.nd.empty((8,), "float32")) for _ in range(2))
    x = relay.var("x", shape=(8,))
    rebuilt = relay.Constant(inside.data)  # another node, the same buffer
    fused = relay.Function([x], relay.add(x, rebuilt)).with_attr("Primitive", 1)
    y = relay.var("y", shape=(8,))
    mod = tvm.IRModule.from_expr(relay.Function([y], relay.Call(fused, [relay.add(y, outside)])))
    computed: list[str] = []
    with deferred_placeholders() as unfilled:
        deferred = current()
        for name, const in (("inside", inside), ("outside", outside)):
            value = np.full(8, len(computed) + 1, "float32")
            deferred.add(const, lambda name=name, value=value: computed.append(name) or value)
        fill_inside_tasks(mod)
        assert computed == ["inside"] and list(unfilled.values()) == [outside]
    assert inside.data.numpy().tolist() == [1] * 8


def _scaled_conv(scale: relay.Expr) -> tvm.IRModule:
    """conv2d (4096 channels) -> relu -> multiply by ``scale``: BackwardFoldScaleAxis folds the
    scale into the weight only if it reads every element as positive (relu comes between)."""
    x = relay.var("x", shape=(1, 4, 2, 2))
    weight = relay.const(np.full((4096, 4, 1, 1), 0.5, "float32"))
    conv = relay.nn.relu(relay.nn.conv2d(x, weight, kernel_size=(1, 1), channels=4096))
    return tvm.IRModule.from_expr(relay.Function([x], relay.multiply(conv, scale)))


def test_a_deferred_scale_is_computed_before_fold_scale_axis_reads_its_sign() -> None:
    """The scale is a fold result large enough to be deferred; the scale pass reads it in C++."""
    positive = relay.const(np.linspace(1, 2, 4096, dtype="float32"))
    mod = _scaled_conv(relay.reshape(positive, (4096, 1, 1)))
    tasks = assert_meta_schedule_matches(mod, {}, X86)
    assert not any("multiply" in t.task_name for t in tasks)  # the scale was folded away


def test_a_deferred_constant_is_computed_before_tvm_simplifies_a_cut_holding_it() -> None:
    """``(x * c1) * c2`` with c1 deferred: TVM's rewrite folds ``c1 * c2`` with its evaluator."""
    x = relay.var("x", shape=(64, 64))
    c1 = relay.transpose(relay.const(np.linspace(1, 2, 4096, dtype="float32").reshape(64, 64)))
    c2 = relay.const(np.float32(3))
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.exp(x * c1 * c2)))
    left, (ours, theirs) = _prefix_and_ours(mod)
    assert tvm.ir.structural_equal(ours, theirs)
    assert left == {}  # c1 was read, so computed


def _prefix_and_ours(mod: tvm.IRModule) -> tuple[Any, tuple[tvm.IRModule, tvm.IRModule]]:
    """Our pipeline (deferral on) and upstream's prefix + FuseOps, with every constant still
    outside a fused function computed in ours (as something would compute it on reading)."""
    from relay_tasks.optimize.placeholders import deferred_placeholders, fill_all

    with (
        extraction_scope(tvm.target.Target(X86), PassSettings(config=dict(DEFAULT_PASS_CONFIG))),
        deferred_placeholders() as unfilled,
    ):
        ours = optimize(as_module(mod), {})
        left = dict(unfilled)
        fill_all()
    prefix = tvm.get_global_func("relay.backend.GetPassPrefixSeq")(True, True)
    with tvm.target.Target(X86), tvm.transform.PassContext(3, config=dict(DEFAULT_PASS_CONFIG)):
        theirs = tvm.transform.Sequential([prefix, relay.transform.FuseOps()])(mod)
    return left, (ours, theirs)


def test_python_hooks_read_deferred_weights_computed(monkeypatch) -> None:
    """A layout hook that reads the weight it is given sees the folded values."""
    seen: list[np.ndarray] = []

    def hook(attrs: Any, inputs: Any, tinfos: Any, out_type: Any) -> None:
        if isinstance(inputs[1], relay.Constant):
            seen.append(inputs[1].data.numpy())

    from tvm import topi

    monkeypatch.setattr(topi.nn, "dense_alter_layout", hook)
    values = np.linspace(-1, 1, 64 * 128, dtype="float32").reshape(128, 64)
    x = relay.var("x", shape=(2, 64))
    weight = relay.transpose(relay.const(values.T.copy()))  # large: deferred by the first fold
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, weight)))
    with extraction_scope(tvm.target.Target(X86), PassSettings(config=dict(DEFAULT_PASS_CONFIG))):
        optimize(as_module(mod), {})
    assert seen and all(np.array_equal(s, values) for s in seen)


def test_the_read_hook_is_installed_while_any_extraction_needs_it() -> None:
    from relay_tasks.optimize.placeholders import filled_on_read

    assert "data" not in vars(relay.Constant)
    with filled_on_read():
        with filled_on_read():  # another thread's extraction, say
            assert "data" in vars(relay.Constant)
        assert "data" in vars(relay.Constant)
        assert relay.const(np.ones(2, "float32")).data.numpy().tolist() == [1, 1]
    assert "data" not in vars(relay.Constant)
