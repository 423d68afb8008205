"""AutoTVM adapter: equal to ``autotvm.task.extract_from_program`` on every zoo row."""

from __future__ import annotations

import json
import re

import pytest
import tvm
from tvm import autotvm, relay, topi
from tvm.relay.op import op as _op
from tvm.relay.op.strategy.generic import wrap_compute_dense, wrap_topi_schedule
from tvm.relay.testing.temp_op_attr import TempOpAttr

from relay_tasks import ModelError
from relay_tasks.adapters import get_adapter
from relay_tasks.autotvm import extract_tasks

import oracles
from checks import assert_autotvm_matches
from cuda_schedules import cuda_injective_schedules
from zoo import CUDA, X86, load, model_target_rows


def _ours(model: str, target: str, **options) -> list[tuple[str, tuple]]:
    mod, params = load(model)
    return [(t.name, t.args) for t in extract_tasks(mod, target, params, **options)]


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_equals_upstream_extraction(model: str, target: str) -> None:
    expected = oracles.autotvm_tasks(model, target)
    with cuda_injective_schedules():  # around both calls, as upstream needs it on CUDA
        assert _ours(model, target) == expected


@pytest.mark.slow  # 27 s; the default run compares ResNet-18 on CUDA with the patch applied
@pytest.mark.parametrize("model", ["resnet-18"])
def test_ours_needs_no_patch_on_cuda_where_stock_upstream_fails(model: str) -> None:
    mod, params = load(model)
    stock_upstream = autotvm.task.extract_from_program(
        load(model)[0]["main"], target=CUDA, params=params
    )
    expected = oracles.autotvm_tasks(model, CUDA)
    assert len(stock_upstream) < len(expected)  # the error died in upstream's helper thread
    assert _ours(model, CUDA) == expected


def test_ops_filter_matches_upstream() -> None:
    mod, params = load("dense_softmax")
    ops = [relay.op.get("nn.dense")]
    expected = autotvm.task.extract_from_program(
        load("dense_softmax")[0]["main"], params, X86, ops=ops
    )
    assert _ours("dense_softmax", X86, ops=ops) == [(t.name, t.args) for t in expected]
    assert _ours("dense_softmax", X86, ops=[relay.op.get("nn.conv2d")]) == []


def test_tasks_are_autotvm_tasks_with_their_config_space() -> None:
    mod, params = load("conv_bias_bn_relu")
    tasks = extract_tasks(mod, X86, params)
    assert all(isinstance(t, autotvm.task.Task) for t in tasks)
    assert all(len(t.config_space) > 1 for t in tasks)
    assert {str(t.target) for t in tasks} == {str(tvm.target.Target(X86))}


@pytest.mark.parametrize(
    ("model", "target"),
    [("conv_bias_bn_relu", X86), ("dense_softmax", X86), ("conv_bias_bn_relu", CUDA)],
)
def test_tasks_are_built_as_autotvm_task_create_builds_them(model: str, target: str) -> None:
    """create_task skips only upstream's failing attribute probe: every field is upstream's."""
    from relay_tasks.adapters.autotvm import create_task

    mod, params = load(model)
    tgt = tvm.target.Target(target, host=X86 if target == CUDA else None)
    templates = extract_tasks(mod, tgt, params)
    assert templates
    for template in templates:
        ours = create_task(template.name, template.args, tgt)
        theirs = autotvm.task.create(template.name, template.args, target=tgt)
        assert (ours.name, ours.args, ours.flop) == (theirs.name, theirs.args, theirs.flop)
        assert str(ours.config_space) == str(theirs.config_space)
        assert ours.config_space.code_hash == theirs.config_space.code_hash
        assert (str(ours.target), str(ours.target_host)) == (
            str(theirs.target),
            str(theirs.target_host),
        )


def test_a_code_hash_the_template_attaches_reaches_the_config_space() -> None:
    from relay_tasks.adapters.autotvm import create_task

    @autotvm.template("relay_tasks_test.hashed_add")
    def hashed_add(n: int) -> tuple:
        a = tvm.te.placeholder((n,), name="a")
        b = tvm.te.compute((n,), lambda i: a[i] + 1, name="b")
        schedule = tvm.te.create_schedule(b.op)

        @autotvm.task.attach_code_hash(schedule)
        def define_space() -> None:
            autotvm.get_config().define_split("split", b.op.axis[0], num_outputs=2)

        define_space()
        return schedule, [a, b]

    ours = create_task("relay_tasks_test.hashed_add", (64,), tvm.target.Target(X86))
    theirs = autotvm.task.create("relay_tasks_test.hashed_add", (64,), target=X86)
    assert ours.config_space.code_hash == theirs.config_space.code_hash is not None
    assert str(ours.config_space) == str(theirs.config_space)


def _dense_strategy(schedule):
    def strategy(attrs, inputs, out_type, target):
        result = _op.OpStrategy()
        result.add_implementation(
            wrap_compute_dense(topi.x86.dense_nopack), schedule, name="dense_nopack.x86", plevel=100
        )
        return result

    return strategy


def _broken(attrs, outs, target):
    raise RuntimeError("this TE schedule is broken")


def test_a_broken_te_schedule_does_not_stop_extraction() -> None:
    """Upstream stops at the first function whose schedule raises, silently; ours needs none."""
    working = wrap_topi_schedule(topi.x86.schedule_dense_nopack)
    with TempOpAttr("nn.dense", "FTVMStrategy", _dense_strategy(working)):
        expected = oracles.autotvm_tasks.__wrapped__("dense_softmax", X86)
    with TempOpAttr("nn.dense", "FTVMStrategy", _dense_strategy(_broken)):
        broken_upstream = autotvm.task.extract_from_program(
            load("dense_softmax")[0]["main"], target=X86, params=load("dense_softmax")[1]
        )
        ours = _ours("dense_softmax", X86)
    assert len(expected) == 2 and len(broken_upstream) < 2
    assert ours == expected


def test_registry_and_unknown_options() -> None:
    mod, params = load("dense_softmax")
    rows = get_adapter("autotvm").extract(mod, X86, params)
    assert [r.native.name for r in rows] == [
        name for name, _ in oracles.autotvm_tasks("dense_softmax", X86)
    ]
    assert {r.anchor_op for r in rows} == {"nn.dense"}
    with pytest.raises(ModelError, match="unknown AutoTVM option\\(s\\): module_equality"):
        get_adapter("autotvm").extract(mod, X86, params, module_equality="structural")


def test_a_template_weighs_every_call_of_every_function_that_needs_it() -> None:
    """repeated_blocks: four equal convs. Blocks 0 and 2 fuse conv+relu, blocks 1 and 3 add the
    residual too (another function, also twice), and all four run the one conv template:
    weight 4 (upstream's AutoTVM tasks carry no weight to compare with). The task's function
    is the first that needs it."""
    mod, params = load("repeated_blocks")
    (task,) = get_adapter("autotvm").extract(mod, X86, params)
    assert (task.name, task.weight, task.anchor_op) == ("conv2d_NCHWc.x86", 4, "nn.conv2d")
    assert task.source is not None and task.source.weight == 2


@pytest.mark.parametrize(
    ("trials", "valid", "spaces", "plan"),
    [
        (7, [0, 0, 0], [100, 100, 100], [3, 2, 2]),  # even shares, the first ones one more
        (4, [1, 0], [100, 100], [1, 2]),  # only valid measurements count: the rest is retried
        (4, [2, 3], [100, 100], [0, 0]),  # the budget is met
        (10, [0, 0], [2, 100], [2, 5]),  # a small config space caps its task's share
        # An interrupted budget of 500 left the first task 4; asked for 6 in all, the second
        # task gets the 2 missing, not its share of 3.
        (6, [4, 0], [100, 100], [0, 2]),
        (4, [0, 3], [100, 100], [1, 0]),
        (4, [0, 5], [100, 100], [0, 0]),  # past the budget in all: nothing more
        (5, [0, 0, 3], [100, 100, 100], [2, 0, 0]),  # the first task takes all that is missing
    ],
)
def test_allotments_spend_only_the_missing_trials(trials, valid, spaces, plan) -> None:
    from relay_tasks.adapters.autotvm import allotments

    assert allotments(trials, valid, spaces) == plan
    with pytest.raises(ValueError):
        allotments(trials, valid, spaces[1:])  # a config space per task, or a bug upstream of here


def test_allotments_follow_each_tasks_part_of_the_latency() -> None:
    from relay_tasks.adapters.autotvm import allotments

    assert allotments(10, [0, 0, 0], [100, 100, 100], [0.06, 0.03, 0.01]) == [6, 3, 1]
    assert allotments(10, [0, 0, 0], [2, 100, 100], [0.06, 0.03, 0.01]) == [2, 3, 1]
    assert allotments(10, [0, 0, 4], [100, 100, 100], [0.06, 0.03, 0.01]) == [6, 0, 0]


def test_measurements_are_read_from_autotvms_own_log(tmp_path) -> None:
    """Records written by AutoTVM's encoder: a valid one is its mean cost, a failure names its
    error and the cause tune kept beside the log (AutoTVM keeps none in it), a record of another
    task keeps that task's key."""
    from tvm.autotvm.measure import MeasureErrorNo, MeasureInput, MeasureResult

    from relay_tasks.adapters.autotvm import key, measurements
    from relay_tasks.adapters.base import cause_lines
    from relay_tasks.adapters.journal import append

    mod, params = load("dense_softmax")
    rows = get_adapter("autotvm").extract(mod, X86, params)
    assert measurements(tmp_path) == []  # nothing tuned yet: no log
    first, second = (
        autotvm.task.create(r.native.name, r.native.args, target=X86) for r in rows[:2]
    )
    records = [
        (first, MeasureResult((1e-3, 4e-3), MeasureErrorNo.NO_ERROR, 0.5, 0.0)),
        (first, MeasureResult((RuntimeError("x"),), MeasureErrorNo.RUNTIME_DEVICE, 0.5, 0.0)),
        (second, MeasureResult((2e-3,), MeasureErrorNo.NO_ERROR, 0.5, 0.0)),
    ]
    lines = [
        autotvm.record.encode(MeasureInput(t.target, t, t.config_space.get(0)), r)
        for t, r in records
    ]
    (tmp_path / "autotvm.log").write_text("\n".join(lines) + "\n")
    assert measurements(tmp_path)[1].error == "RUNTIME_DEVICE: unknown error"  # no cause kept
    append(
        tmp_path, [("autotvm_errors.jsonl", cause_lines(["RuntimeError: x"]))]
    )  # what tune keeps
    got = measurements(tmp_path)
    assert [(m.key, m.seconds, m.error) for m in got] == [
        (rows[0].key, pytest.approx(2.5e-3), ""),
        (rows[0].key, None, "RUNTIME_DEVICE: RuntimeError: x"),
        (rows[1].key, pytest.approx(2e-3), ""),
    ]
    assert rows[0].key == key(first) != rows[1].key


@pytest.mark.xdist_group("tuning")
def test_tune_spends_the_budget_on_valid_measurements_and_builds_with_them(
    tmp_path, monkeypatch
) -> None:
    """Every template tuned: the build finds a record for each (no default schedule). A resumed
    tune starts each tuner's cost model from its task's records already in the log."""
    import logging

    from tvm.autotvm.task.dispatcher import DispatchContext

    from tuned_models import assert_runs_as_numpy, tune_in_process

    seeded: list[tuple[int, bool]] = []
    load_history = autotvm.tuner.XGBTuner.load_history
    monkeypatch.setattr(
        autotvm.tuner.XGBTuner,
        "load_history",
        lambda tuner, history, **kw: (
            load_history(tuner, history, **kw),
            seeded.append((len(history), tuner.cost_model.base_model is not None)),
        ),
    )
    # 3 trials: 2 for the first template, 1 for the second; resumed to 4, only the second
    # gets one more.
    tuned = tune_in_process("autotvm", tmp_path, [3, 4])
    assert seeded == [(1, True)]  # the resume, for the one template it tunes: a fitted model
    valid = [(task, s) for task, s in tuned.records if s is not None]
    assert all(0 < s < 1 for _, s in valid)
    first, second = dict.fromkeys(task for task, _ in tuned.records)
    assert [task for task, _ in valid].count(first) == 2
    assert [task for task, _ in valid].count(second) == 2
    fallbacks: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: fallbacks.append(record.getMessage())  # type: ignore[method-assign]
    autotvm_logger = logging.getLogger("autotvm")
    level = autotvm_logger.level
    autotvm_logger.addHandler(handler)
    autotvm_logger.setLevel(logging.DEBUG)  # where relay.build reports a default schedule
    DispatchContext.warning_messages = set()  # reported once per process
    try:
        library = tuned.build()
    finally:
        autotvm_logger.removeHandler(handler)
        autotvm_logger.setLevel(level)
    assert [m for m in fallbacks if "Cannot find tuning records" in m] == []
    assert_runs_as_numpy(library)


def test_flops_are_computed_for_a_task_whose_config_space_is_not_built() -> None:
    """A task read back from a record has no FLOP count until its config space is built."""
    from relay_tasks.adapters.autotvm import flops

    args = (("TENSOR", (4, 256), "float32"), ("TENSOR", (128, 256), "float32"), None, "float32")
    built = autotvm.task.create("dense_nopack.x86", args, target=X86)
    bare = autotvm.task.Task("dense_nopack.x86", args)
    bare.target = built.target
    assert bare.flop is None
    assert flops(bare) == flops(built) == built.flop >= 2 * 4 * 128 * 256


@pytest.mark.parametrize(
    ("args", "shape"),
    [
        ((("TENSOR", (4, 16), "float32"), ("TENSOR", (8, 16), "float32"), None, "float32"), None),
        ((("TENSOR", (4, 16), "float32"), ("TENSOR", (tvm.tir.Any(), 16), "float32")), "(?, 16)"),
        ((("TENSOR", (tvm.tir.Var("n", "int64"), 2), "int8"), (3, 4), "NCHW"), "(?, 2)"),
        (((1, tvm.tir.Any()), ("TENSOR", (2, 2), "float32")), None),  # only tensors' shapes count
    ],
)
def test_the_first_dynamic_tensor_shape_in_a_templates_arguments(args, shape) -> None:
    from relay_tasks.adapters.autotvm.tasks import _dynamic_tensor_shape

    assert _dynamic_tensor_shape(args) == shape


def _three_parallel_dense() -> tuple[tvm.IRModule, dict]:
    """Three dense ops on one input: opt_level 4 combines them (CombineParallelDense)."""
    import numpy as np

    data = relay.var("data", shape=(4, 16))
    weights = [relay.var(f"w{i}", shape=(16, 16)) for i in range(3)]
    out = relay.nn.dense(data, weights[0])
    for w in weights[1:]:
        out = relay.add(out, relay.nn.dense(data, w))
    rng = np.random.default_rng(5)
    params = {w.name_hint: rng.standard_normal((16, 16)).astype("float32") for w in weights}
    return tvm.IRModule.from_expr(relay.Function([data, *weights], out)), params


def _low_rank_update() -> tuple[tvm.IRModule, dict]:
    """A second layer whose weight is computed from weights (W + A B^T, a merged low-rank
    adapter). Bound, FoldConstant computes that dense, tracing its templates first; unbound,
    they are traced where the dense is called, after the first layer's."""
    import numpy as np

    rng = np.random.default_rng(5)
    shapes = {"w1": (16, 16), "w": (16, 16), "a": (16, 4), "b": (16, 4)}
    x = relay.var("x", shape=(1, 16))
    w1, w, a, b = (relay.var(n, shape=s) for n, s in shapes.items())
    hidden = relay.nn.dense(x, w1)
    out = relay.nn.dense(hidden, relay.add(w, relay.nn.dense(a, b)))
    mod = tvm.IRModule.from_expr(relay.Function([x, w1, w, a, b], out))
    params = {n: tvm.nd.array(rng.standard_normal(s).astype("float32")) for n, s in shapes.items()}
    return mod, params


def test_weights_computed_from_weights_are_traced_where_upstream_folds_them() -> None:
    mod, params = _low_rank_update()
    bound = assert_autotvm_matches(mod, params, X86)
    assert bound[0][1][0] == ("TENSOR", (16, 4), "float32")  # the folded dense's, first
    unbound = [(t.name, t.args) for t in extract_tasks(mod, X86, None)]
    assert sorted(unbound) == sorted(bound) and unbound != bound  # the params decide the order


def test_several_models_equal_upstreams_multiple_program_extraction() -> None:
    """Models, one repeated, whose tasks depend on the opt_level (3 parallel dense combine at
    4); a template shared between them is found once, in upstream's order; the ops filter
    reaches every model."""
    from relay_tasks.adapters.autotvm import extract_tasks_from_models

    models = [load("conv_bias_bn_relu"), _three_parallel_dense(), load("conv_bias_bn_relu")]
    mods, params = [m for m, _ in models], [p for _, p in models]
    upstream = autotvm.task.extract_from_multiple_program(
        [oracles.copy_module(m)["main"] for m in mods], params, X86
    )
    ours = extract_tasks_from_models(mods, X86, params)
    assert [(t.name, t.args) for t in ours] == [(t.name, t.args) for t in upstream]
    first_two = extract_tasks_from_models(mods[:2], X86, params[:2])
    assert [(t.name, t.args) for t in first_two] == [(t.name, t.args) for t in ours]
    host = "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"
    hosted = extract_tasks_from_models(mods, X86, params, target_host=host)
    assert {str(t.target.host) for t in hosted} == {str(tvm.target.Target(host))}  # every model
    combined = extract_tasks_from_models(mods, X86, params, opt_level=4)
    assert [(t.name, t.args) for t in combined] != [(t.name, t.args) for t in ours]
    dense = [relay.op.get("nn.dense")]
    only = extract_tasks_from_models(mods, X86, params, ops=dense)
    assert [t.name for t in only] == [t.name for t in ours if "dense" in t.name] != []
    with pytest.raises(ValueError):
        extract_tasks_from_models(mods, X86, params[:2])  # a model without its params entry
    # Each model's params are bound, the first's and the others' (they decide the order).
    for models in (
        [_low_rank_update(), load("dense_softmax")],
        [load("dense_softmax"), _low_rank_update()],
    ):
        mods, params = [m for m, _ in models], [p for _, p in models]
        upstream = autotvm.task.extract_from_multiple_program(
            [oracles.copy_module(m)["main"] for m in mods], params, X86
        )
        ours = extract_tasks_from_models(mods, X86, params)
        assert [(t.name, t.args) for t in ours] == [(t.name, t.args) for t in upstream]


def test_task_payloads_derive_the_same_templates_here_and_malformed_ones_are_refused() -> None:
    """A payload names the template and carries the function whose lowering traces it here
    (alternatives of one dense come from one function); a task no function traced
    carries the template's arguments instead, read from an allowlist."""
    from relay_tasks.adapters.autotvm import decode, encode, merge

    mod, params = load("dense_softmax")
    rows = get_adapter("autotvm").extract(mod, X86, params)
    target = tvm.target.Target(X86)
    for row in rows:
        back, source = decode(encode(row), target, row.name, row.weight)
        assert (back.name, back.args, str(back.target)) == (
            row.native.name,
            row.native.args,
            str(target),
        )
        assert tvm.ir.structural_equal(source.func, row.source.func)
        traced_only = {"template": row.native.name, "args": encode(row)}
        traced_only["args"] = json.loads(json.dumps(row.native.args))
        back, source = decode(traced_only, target, row.name, row.weight)
        assert (back.name, back.args, source) == (row.native.name, row.native.args, None)
    args = json.loads(json.dumps(rows[0].native.args))
    refused = {
        "1 is not a registered AutoTVM template": {"template": 1, "args": args},
        "'system' is not a registered AutoTVM template": {"template": "system", "args": args},
        "is not a template argument": {"template": rows[0].native.name, "args": ["a;b"]},
        "is not an integer from 0 to 16777216": {
            "template": rows[0].native.name,
            "args": [["TENSOR", [2**40], "float32"]],
        },
        "its payload holds 'extra', which it may not": {**encode(rows[0]), "extra": 1},
    }
    for message, payload in refused.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            decode(payload, target, "x", 1)
    assert merge(rows[1:]) is rows[1].native


def test_the_registry_hands_every_option_on() -> None:
    """ops, opt_level and target_host reach the extraction from the registry as from
    extract_tasks; each changes the answer here, so a dropped one shows."""
    import re

    mod, params = _three_parallel_dense()
    host = "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"
    dense, conv = [relay.op.get("nn.dense")], [relay.op.get("nn.conv2d")]
    for options in ({}, {"opt_level": 4}, {"ops": conv}, {"ops": dense, "target_host": host}):
        rows = get_adapter("autotvm").extract(mod, X86, params, **options)
        natives = extract_tasks(mod, X86, params, **options)
        assert [(r.native.name, r.native.args) for r in rows] == [(t.name, t.args) for t in natives]
        assert [str(r.native.target.host) for r in rows] == [str(t.target.host) for t in natives]
        assert all(re.fullmatch("[0-9a-f]{16}", r.key) for r in rows)
        assert {r.anchor_op for r in rows} <= {"nn.dense", "nn.batch_matmul"}
    plain = extract_tasks(mod, X86, params)
    assert [t.name for t in extract_tasks(mod, X86, params, opt_level=4)] != [t.name for t in plain]
    assert extract_tasks(mod, X86, params, ops=conv) == []
    hosted = extract_tasks(mod, X86, params, target_host=host)
    assert {str(t.target.host) for t in hosted} == {str(tvm.target.Target(host))}
    assert {t.target.host for t in plain} == {None}
    with pytest.raises(ModelError, match="unknown AutoTVM option\\(s\\): executor, mode"):
        get_adapter("autotvm").extract(mod, X86, params, mode=1, executor=None)


def test_a_failed_builds_cause_is_its_error_not_the_traceback_start() -> None:
    """AutoTVM reports a failed build as a (traceback, error) pair: the cause kept is the
    error's line (its ``str`` was one line of escaped newlines, cut at the traceback's start)."""
    from relay_tasks.adapters.autotvm.database import _report
    from relay_tasks.adapters.base import failure_cause

    traceback = 'Traceback (most recent call last):\n  File "measure_methods.py", line 565\n'
    error = tvm.TVMError("InternalError: Check failed: (bound) is false: group mismatch")
    assert failure_cause(_report((traceback, error))) == str(error).splitlines()[-1].strip()
    assert failure_cause(_report("RuntimeError: device lost")) == "RuntimeError: device lost"


def test_a_task_starts_from_the_nearest_points_of_its_similar_tasks_fastest_configs(
    tmp_path,
) -> None:
    """A dense of 24 output rows taught by one of 16: the tutor's two fastest configs, each at
    the nearest point of its own space (an inner factor of 16 rows, which does not divide 24,
    becomes 12, nearer than 24; the others are kept), fastest first; the slower third is
    left; another template (``dense_pack``, other knobs) starts from nothing."""
    from relay_tasks.adapters.autotvm import create_task
    from relay_tasks.adapters.autotvm.session import _Tutors

    def dense(template: str, rows: int) -> autotvm.task.Task:
        args = (("TENSOR", (1, 32), "float32"), ("TENSOR", (rows, 32), "float32"), None,
                "float32")  # fmt: skip
        return create_task(template, args, tvm.target.Target(X86))

    def config(task: autotvm.task.Task, **factors: int) -> autotvm.task.space.ConfigEntity:
        space = task.config_space
        wanted = {name: [-1, factors.get(name, 1)] for name in space.space_map}
        index = next(i for i in range(len(space)) if all(
            space.get(i)[name].size == size for name, size in wanted.items()))  # fmt: skip
        return space.get(index)

    tutor, me = dense("dense_nopack.x86", 16), dense("dense_nopack.x86", 24)
    other = dense("dense_pack.x86", 24)
    tutors = _Tutors()
    tutors.read(tmp_path / "no-log", [tutor, me, other])
    for seconds, factors in ((2e-5, {"tile_x": 16}), (1e-5, {"tile_x": 4, "tile_k": 8}),
                             (3e-5, {"tile_x": 2})):  # fmt: skip
        tutors.add(get_adapter("autotvm").key(tutor), seconds, config(tutor, **factors))
    starts = [me.config_space.get(index) for index in tutors.starts(me)]
    assert [{k[0]: k[2] for k in c.to_json_dict()["entity"]} for c in starts] == [
        {"tile_y": [-1, 1], "tile_x": [-1, 4], "tile_k": [-1, 8]},
        {"tile_y": [-1, 1], "tile_x": [-1, 12], "tile_k": [-1, 1]},
    ]
    assert tutors.starts(other) == []
