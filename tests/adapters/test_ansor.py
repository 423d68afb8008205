"""Ansor adapter: equal to ``auto_scheduler.extract_tasks`` (keys, descriptions, weights, order)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tvm
from tvm import auto_scheduler, relay, topi
from tvm.relay.op import op as _op
from tvm.relay.op.strategy.generic import wrap_compute_dense, wrap_topi_schedule
from tvm.relay.testing.temp_op_attr import TempOpAttr

from relay_tasks import ModelError, UsageError
from relay_tasks.adapters import get_adapter
from relay_tasks.adapters.ansor import key as ansor_key
from relay_tasks.ansor import extract_tasks

import oracles
from cuda_schedules import cuda_injective_schedules
from zoo import CUDA, X86, load, model_target_rows


def _ours(model: str, target: str, **options) -> list[tuple]:
    mod, params = load(model)
    tasks, weights = extract_tasks(
        mod, target, params, hardware_params=oracles.hardware_params(target), **options
    )
    return [(t.workload_key, t.desc, w) for t, w in zip(tasks, weights, strict=True)]


@pytest.mark.parametrize("simple", [False, True], ids=["complex-only", "with-simple"])
@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_equals_upstream_extraction(model: str, target: str, simple: bool) -> None:
    expected = oracles.ansor_tasks(model, target, simple)
    with cuda_injective_schedules():  # around both calls, as upstream needs it on CUDA
        assert _ours(model, target, include_simple_tasks=simple) == expected


@pytest.mark.parametrize("simple", [False, True], ids=["complex-only", "with-simple"])
def test_an_extern_op_is_left_out_as_upstream_leaves_it_without_a_tvm_error(
    simple: bool, monkeypatch
) -> None:
    """x86's concatenate of static shapes is an extern op, which Ansor's ComputeDAG refuses
    (no task, upstream too): it is not handed to it, so no TVM error is raised (the first
    costs 0.17 s of backtrace)."""
    from tvm.auto_scheduler import relay_integration

    refused: list[str] = []
    made = relay_integration.ComputeDAG

    def counted(tensors):
        try:
            return made(tensors)
        except tvm.TVMError as err:
            refused.append(str(err).splitlines()[-1])
            raise

    monkeypatch.setattr(relay_integration, "ComputeDAG", counted)
    ours = _ours("concat_pool", X86, include_simple_tasks=simple)
    assert refused == []
    monkeypatch.undo()
    assert ours == oracles.ansor_tasks("concat_pool", X86, simple)


@pytest.mark.slow  # 31 s; the default run compares ResNet-18 on CUDA with the patch applied
def test_ours_needs_no_patch_on_cuda_where_stock_upstream_fails() -> None:
    mod, params = load("resnet-18")
    hardware = oracles.hardware_params(CUDA)
    try:
        stock_tasks, _ = auto_scheduler.extract_tasks(
            load("resnet-18")[0]["main"], params, CUDA, hardware_params=hardware
        )
        stock = len(stock_tasks)
    except tvm.TVMError:
        stock = 0
    expected = oracles.ansor_tasks("resnet-18", CUDA)
    assert stock < len(expected)
    assert _ours("resnet-18", CUDA) == expected


@pytest.mark.parametrize("target", [X86, CUDA])
def test_nhwc_models_equal_upstream(target: str) -> None:
    """Ansor users convert convolutions to NHWC first; the tasks must still match."""
    mod, params = load("conv_bias_bn_relu")
    desired = {"nn.conv2d": ["NHWC", "default"]}
    convert = tvm.transform.Sequential(
        [relay.transform.InferType(), relay.transform.ConvertLayout(desired)]
    )
    with tvm.transform.PassContext(opt_level=3):
        nhwc, upstream_copy = convert(mod), convert(load("conv_bias_bn_relu")[0])
    hardware = oracles.hardware_params(target)
    with cuda_injective_schedules():
        tasks, weights = auto_scheduler.extract_tasks(
            upstream_copy["main"], params, target, hardware_params=hardware
        )
        ours, our_weights = extract_tasks(nhwc, target, params, hardware_params=hardware)
    assert "NHWC" in nhwc.astext()
    assert [(t.workload_key, t.desc) for t in ours] == [(t.workload_key, t.desc) for t in tasks]
    assert our_weights == [int(w) for w in weights]


def _dense_strategy(schedule):
    def strategy(attrs, inputs, out_type, target):
        result = _op.OpStrategy()
        result.add_implementation(
            wrap_compute_dense(topi.nn.dense), schedule, name="dense.generic", plevel=100
        )
        return result

    return strategy


def _broken(attrs, outs, target):
    raise RuntimeError("this TE schedule is broken")


def test_a_broken_te_schedule_does_not_stop_extraction() -> None:
    working = wrap_topi_schedule(topi.generic.schedule_dense)
    with TempOpAttr("nn.dense", "FTVMStrategy", _dense_strategy(working)):
        expected = oracles.ansor_tasks.__wrapped__("dense_softmax", X86)
    with TempOpAttr("nn.dense", "FTVMStrategy", _dense_strategy(_broken)):
        try:  # the error dies in upstream's helper thread: a short list, or an error
            broken, _ = auto_scheduler.extract_tasks(
                load("dense_softmax")[0]["main"], load("dense_softmax")[1], X86
            )
        except tvm.TVMError:
            broken = []
        ours = _ours("dense_softmax", X86)
    assert len(expected) == 3 and len(broken) < 3
    assert ours == expected


def test_tasks_are_search_tasks_ready_to_tune() -> None:
    mod, params = load("conv_bias_bn_relu")
    tasks, weights = extract_tasks(mod, X86, params)
    assert all(isinstance(t, auto_scheduler.SearchTask) for t in tasks)
    assert all(w >= 1 for w in weights)
    assert all(t.compute_dag is not None for t in tasks)


def test_registry_takes_target_before_params_like_every_tuner() -> None:
    mod, params = load("dense_softmax")
    rows = get_adapter("ansor").extract(mod, X86, params)
    assert [(r.native.workload_key, r.name, r.weight) for r in rows] == oracles.ansor_tasks(
        "dense_softmax", X86
    )
    with pytest.raises(ModelError, match="unknown Ansor option\\(s\\): ops"):
        get_adapter("ansor").extract(mod, X86, params, ops=[])


def test_upstreams_argument_order_is_refused_with_the_house_order_named() -> None:
    mod, params = load("dense_softmax")
    with pytest.raises(UsageError) as refused:
        extract_tasks(mod, params, X86)
    message = str(refused.value)
    assert message.startswith("relay_tasks.ansor.extract_tasks takes (mod, target, params);")
    # the fix: what the arguments look like, and where upstream's order is taken
    assert "in upstream's order (mod, params, target)" in message
    assert message.endswith("auto_scheduler.extract_tasks takes with relay_tasks.install()")


def test_a_shape_that_reads_a_tensor_is_one_extraction_error() -> None:
    """An SSD head on a batch known only at run time: the decoded boxes' shape reads a tensor,
    and Ansor's shape reader (``traverse_to_get_io_tensors``) raises a raw TVMError upstream.
    Ours says which function and what to do. Found by the fuzzer (x86)."""
    import numpy as np

    from relay_tasks import ExtractionError

    from checks import assert_ansor_matches

    data = relay.var("data", shape=(relay.Any(), 16))
    scores, offsets = relay.var("scores", shape=(8, 16)), relay.var("offsets", shape=(16, 16))
    probs = relay.nn.softmax(relay.reshape(relay.nn.dense(data, scores), (-1, 2, 4)), axis=1)
    anchors = np.sort(np.random.default_rng(0).uniform(0, 1, (1, 4, 2, 2)), axis=2)
    boxes = relay.vision.multibox_transform_loc(
        probs, relay.nn.dense(data, offsets), relay.const(anchors.reshape(1, 4, 4), "float32")
    )[0]
    mod = tvm.IRModule.from_expr(relay.Function([data, scores, offsets], boxes))
    params = {
        "scores": np.ones((8, 16), "float32"),
        "offsets": np.ones((16, 16), "float32"),
    }
    assert assert_ansor_matches(mod, params, X86, include_simple_tasks=True) == []
    with pytest.raises(
        ExtractionError,
        match=r"^Ansor cannot read the shapes of fused_vision_multibox_transform_loc \(.*\); "
        "upstream's extraction fails here too: give the model static input shapes$",
    ):
        extract_tasks(mod, X86, params, include_simple_tasks=True)


def test_measurements_are_read_from_ansors_own_records(tmp_path) -> None:
    """Records written by Ansor's own writer: a valid one is its mean cost; a failure is named by
    its error code and the cause tune kept beside the log (Ansor's records keep no message);
    costs of a failure never count."""
    from tvm.auto_scheduler.measure import MeasureErrorNo, MeasureInput, MeasureResult

    from relay_tasks.adapters.ansor import measurements
    from relay_tasks.adapters.base import cause_lines
    from relay_tasks.adapters.journal import append

    mod, params = load("dense_softmax")
    rows = get_adapter("ansor").extract(mod, X86, params)
    assert measurements(tmp_path) == []  # nothing tuned yet: no log
    first, second = rows[0].native, rows[1].native
    records = [
        (first, MeasureResult([1e-3, 4e-3], MeasureErrorNo.NO_ERROR, "", 0.5, 0)),
        (first, MeasureResult([1e-3], MeasureErrorNo.RUNTIME_DEVICE, "device lost\nmore", 0.5, 0)),
        (first, MeasureResult([], MeasureErrorNo.NO_ERROR, "", 0.5, 0)),  # nothing ran
        (second, MeasureResult([2e-3], MeasureErrorNo.NO_ERROR, "", 0.5, 0)),
    ]
    inputs = [MeasureInput(t, t.compute_dag.get_init_state()) for t, _ in records]
    auto_scheduler.save_records(str(tmp_path / "ansor.json"), inputs, [r for _, r in records])
    append(tmp_path, [("ansor_errors.jsonl", cause_lines(["device lost"]))])  # what tune keeps
    got = [(m.key, m.seconds, m.error) for m in measurements(tmp_path)]
    assert got == [
        (rows[0].key, pytest.approx(2.5e-3), ""),
        (rows[0].key, None, "RUNTIME_DEVICE: device lost"),
        (rows[0].key, None, "NO_ERROR: unknown error"),  # a failure logged before its cause
        (rows[1].key, pytest.approx(2e-3), ""),
    ]


@pytest.mark.xdist_group("tuning")
def test_tune_spends_the_budget_on_valid_measurements_and_builds_with_them(tmp_path) -> None:
    from tuned_models import assert_one_task_tunes_resumes_and_builds

    assert_one_task_tunes_resumes_and_builds("ansor", tmp_path)


@pytest.mark.xdist_group("tuning")
def test_dense_layers_whose_layout_rewrite_fails_are_tuned_and_built_without_it(tmp_path) -> None:
    """On this TVM build Ansor's layout rewrite fails on every schedule of a dense layer of a
    batch over 1 (upstream's tune of a BERT measured no valid dense schedule, and its build
    fails on a valid record of one): tune measures such a task without the rewrite, and the
    build applies its records to the weights as they are."""
    from tuned_models import assert_runs_as_numpy, tune_in_process

    tuned = tune_in_process("ansor", tmp_path, [4], batch=8)
    valid = [s for _, s in tuned.records if s is not None]
    assert len(tuned.records) == 4 and len(valid) == 4 and all(0 < s < 1 for s in valid)
    assert_runs_as_numpy(tuned.build(), batch=8)


def test_tasks_whose_layout_rewrite_works_keep_it() -> None:
    """Only a task whose rewrite fails is measured without it: a convolution's rewrite of its
    kernel works here, and its task is tuned as upstream's."""
    from relay_tasks.adapters.ansor.tasks import measurable, rewrite_fails

    def first(model: str, anchor_op: str) -> auto_scheduler.SearchTask:
        mod, params = load(model)
        tasks = get_adapter("ansor").extract(mod, X86, params)
        return next(t.native for t in tasks if t.anchor_op == anchor_op)

    dense = first("dense_softmax", "nn.dense")
    conv = first("conv_bias_bn_relu", "nn.contrib_conv2d_NCHWc")
    assert rewrite_fails(dense.compute_dag) and not rewrite_fails(conv.compute_dag)
    assert measurable(conv) is conv
    plain = measurable(dense)
    assert plain.layout_rewrite_option == auto_scheduler.LayoutRewriteOption.NO_REWRITE
    assert (plain.workload_key, plain.desc) == (dense.workload_key, dense.desc)
    assert dense.layout_rewrite_option == conv.layout_rewrite_option != plain.layout_rewrite_option


def test_every_option_reaches_the_search_tasks_as_upstreams_do(tmp_path) -> None:
    """target_host, hardware_params, include_simple_tasks, opt_level and the workload dump, on
    both entry points, against upstream given the same; opt_level 2 changes this model's tasks
    (no FoldScaleAxis), so a dropped opt_level shows."""
    import json

    hardware = auto_scheduler.HardwareParams(
        num_cores=3, vector_unit_bytes=32, cache_line_bytes=128, max_shared_memory_per_block=1,
        max_local_memory_per_block=2, max_threads_per_block=4, max_vthread_extent=5, warp_size=6,
    )  # fmt: skip
    options = {"target_host": "llvm -mtriple=x86_64-linux-gnu", "hardware_params": hardware,
               "include_simple_tasks": True, "opt_level": 2}  # fmt: skip
    mod, params = load("conv_bias_bn_relu")

    def described(tasks, weights) -> list[tuple]:
        return [(t.workload_key, t.desc, str(t.target), str(t.target_host), t.hardware_params.num_cores,
                 t.hardware_params.warp_size, int(t.layout_rewrite_option), int(w))
                for t, w in zip(tasks, weights, strict=True)]  # fmt: skip

    ours_dump, upstream_dump = tmp_path / "ours.json", tmp_path / "upstream.json"
    ours = extract_tasks(mod, X86, params, dump_workload_to_dag_log=str(ours_dump), **options)
    upstream = auto_scheduler.extract_tasks(
        oracles.copy_module(mod), params, X86, dump_workload_to_dag_log=str(upstream_dump),
        **options,
    )  # fmt: skip
    assert described(*ours) == described(*upstream)
    assert json.loads(ours_dump.read_text()) == json.loads(upstream_dump.read_text())
    rows = get_adapter("ansor").extract(mod, X86, params, **options)
    assert described([r.native for r in rows], [r.weight for r in rows]) == described(*upstream)
    default = extract_tasks(mod, X86, params, include_simple_tasks=True)
    assert {t.workload_key for t in default[0]} != {t.workload_key for t in upstream[0]}


def test_cuda_without_a_gpu_needs_hardware_params_which_the_registry_takes_from_the_target():
    """Upstream asks the CUDA runtime, which this machine lacks: the function API names the
    argument to pass; the registry (CLI, task files) reads what the target says, and the tasks
    equal upstream's given the same parameters."""
    from relay_tasks import TargetError
    from relay_tasks.adapters.ansor import default_hardware_params

    mod, params = load("dense_softmax")
    with pytest.raises(TargetError, match=r"hardware_params=auto_scheduler\.HardwareParams"):
        extract_tasks(mod, CUDA, params)
    target = tvm.target.Target(
        "cuda -arch=sm_80 -max_shared_memory_per_block=65536 -max_num_threads=512 "
        "-thread_warp_size=16"
    )
    rows = get_adapter("ansor").extract(mod, target, params)
    hardware = rows[0].native.hardware_params
    assert (hardware.max_shared_memory_per_block, hardware.max_threads_per_block) == (65536, 512)
    assert (hardware.warp_size, hardware.max_vthread_extent) == (16, 4)  # a quarter warp
    assert default_hardware_params(tvm.target.Target(X86)) is None  # the CPU is asked
    plain = default_hardware_params(tvm.target.Target(CUDA))
    expected = oracles.hardware_params(CUDA)
    fields = ("num_cores", "vector_unit_bytes", "cache_line_bytes", "max_shared_memory_per_block",
              "max_local_memory_per_block", "max_threads_per_block", "max_vthread_extent",
              "warp_size")  # fmt: skip
    assert [getattr(plain, f) for f in fields] == [getattr(expected, f) for f in fields]
    upstream = oracles.ansor_tasks("dense_softmax", CUDA)
    ours = get_adapter("ansor").extract(mod, CUDA, params)
    assert [(r.native.workload_key, r.weight) for r in ours] == [(k, w) for k, _, w in upstream]


def test_extraction_is_quiet_and_leaves_tvms_settings_as_it_found_them() -> None:
    from tvm import autotvm

    dispatch = auto_scheduler.DispatchContext.current
    before = (dispatch.verbose, autotvm.GLOBAL_SCOPE.silent)
    mod, params = load("dense_softmax")
    try:
        dispatch.verbose, autotvm.GLOBAL_SCOPE.silent = 1, False
        seen: list[tuple] = []
        real = auto_scheduler.relay_integration.auto_schedule_topi

        def spy(name, outs):
            seen.append(
                (auto_scheduler.DispatchContext.current.verbose, autotvm.GLOBAL_SCOPE.silent)
            )
            return real(name, outs)

        auto_scheduler.relay_integration.auto_schedule_topi = spy
        try:
            extract_tasks(mod, X86, params)
        finally:
            auto_scheduler.relay_integration.auto_schedule_topi = real
        assert seen and set(seen) == {(0, True)}
        assert (dispatch.verbose, autotvm.GLOBAL_SCOPE.silent) == (1, False)
    finally:
        dispatch.verbose, autotvm.GLOBAL_SCOPE.silent = before


def test_task_payloads_derive_the_same_search_task_here() -> None:
    """A task file's Ansor payload (the primitive function) lowers here to the same search
    task: workload key, the functions it stands for as the file names them, and the layout
    rewrite a relay build would ask for on this target; another function's payload derives
    another task."""
    from relay_tasks.adapters.ansor import decode, encode, key, merge

    mod, params = load("repeated_blocks")
    rows = get_adapter("ansor").extract(mod, X86, params)
    target = tvm.target.Target(X86)
    for row in rows:
        back, source = decode(encode(row), target, row.name, row.weight)
        assert back.workload_key == row.native.workload_key
        assert back.desc == row.name == ",".join(sorted(row.native.desc.split(",")))
        assert int(back.layout_rewrite_option) == int(row.native.layout_rewrite_option)
        assert tvm.ir.structural_equal(source.func, row.source.func)
    other, _ = decode(encode(rows[1]), target, rows[0].name, rows[0].weight)
    assert key(other) == rows[1].key != rows[0].key
    assert merge(rows[1:]) is rows[1].native


def test_a_task_starts_from_the_fastest_states_of_the_nearest_tasks_of_its_form(tmp_path) -> None:
    """Tutors of the same compute at other extents, nearest in shapes first, their fastest
    ``STARTS_EACH`` valid states each, each state once (the near task's fastest is the far
    one's, as when it started from it), ``STARTS`` in all; a compute of other operations
    (dense without the relu) and the task's own states give none."""
    from relay_tasks.adapters.ansor.session import _Tutors
    from relay_tasks.adapters.similar import STARTS, STARTS_EACH

    def dense(batch: int, relu: bool = True) -> auto_scheduler.SearchTask:
        data, weight = relay.var("data", shape=(batch, 32)), relay.var("w", shape=(16, 32))
        out = relay.nn.dense(data, weight)
        body = relay.nn.relu(out) if relu else out
        mod = tvm.IRModule.from_expr(relay.Function([data, weight], body))
        [task] = get_adapter("ansor").extract(mod, X86, {"w": np.ones((16, 32), "float32")})
        return task.native

    def split(factor: int) -> Any:
        """A state told apart by ``factor`` (a state's steps keep the extents of the task it
        was found for, on whichever task it is measured)."""
        state = me.compute_dag.get_init_state()
        stage = me.compute_dag.ops[2]
        state.split(stage, state[stage].iters[0], [factor])
        return state

    me, near, far, other = dense(8), dense(6), dense(1), dense(8, relu=False)
    tutors = _Tutors()
    tutors.read(tmp_path / "no-log.json", [me, near, far, other])
    given = {}
    for n, task in enumerate((me, far, other, near)):
        for seconds, factor in ((3e-5, 10 * n + 3), (1e-5, 10 * n + 1), (2e-5, 10 * n + 2)):
            state = split(11 if task is near and seconds == 1e-5 else factor)
            given[id(state)] = (ansor_key(task), seconds)
            tutors.add(ansor_key(task), seconds, state)
    got = [given[id(state)] for state in tutors.starts(me)]
    assert got == [
        (ansor_key(near), 1e-5), (ansor_key(near), 2e-5), (ansor_key(far), 2e-5),
    ][:STARTS] and STARTS_EACH == 2  # fmt: skip
    assert tutors.starts(other) == []


def test_a_pools_flops_are_counted_where_ansors_counter_gives_up(tmp_path) -> None:
    """Ansor counts -1 FLOPs for a compute with a ``select`` (global average pooling's divisor
    has one): the task's FLOPs are still its operations (each of 8 outputs sums 16 values and
    divides once), and a pool at another extent, a similar task, starts from its states (the
    nearness of FLOPs divided by zero on Ansor's -1)."""
    from relay_tasks.adapters.ansor.session import _Tutors

    def pool(side: int) -> auto_scheduler.SearchTask:
        data = relay.var("data", shape=(1, 8, side, side))
        mod = tvm.IRModule.from_expr(relay.Function([data], relay.nn.global_avg_pool2d(data)))
        [task] = get_adapter("ansor").extract(mod, X86, None)
        return task.native

    small, large = pool(4), pool(6)
    assert small.compute_dag.flop_ct == -1  # what the fallback is for
    assert get_adapter("ansor").flops(small) == 8 * (16 + 1)
    tutors = _Tutors()
    tutors.read(tmp_path / "no-log.json", [small, large])
    state = small.compute_dag.get_init_state()
    tutors.add(ansor_key(small), 1e-5, state)
    assert tutors.starts(large) == [state]
