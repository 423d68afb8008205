"""MetaSchedule adapter: equal to upstream's extraction on every zoo row, target and equality."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import meta_schedule as ms
from tvm import relay

from relay_tasks import ModelError
from relay_tasks.adapters import get_adapter
from relay_tasks.adapters.meta_schedule import (
    DEFAULT_PASS_CONFIG,
    MODULE_EQUALITIES,
    extract_task_from_relay,
)
from relay_tasks.adapters.meta_schedule.database import ERRORS
from relay_tasks.adapters.meta_schedule.runner import WRONG

import oracles
from checks import assert_same_extracted_tasks
from small_graphs import SMALL_GRAPHS
from zoo import CUDA, X86, load, model_target_rows


def _equality_rows() -> list:
    """Every zoo row with every module equality; the networks' rows other than "structural" in
    the slow tier (the default run's time: the small graphs exercise each equality)."""
    return [
        pytest.param(*row.values, equality, id=f"{row.id}-{equality}",
                     marks=(*row.marks, *([pytest.mark.slow] if big else [])))
        for row in model_target_rows()
        for equality in MODULE_EQUALITIES
        for big in [row.values[0] not in SMALL_GRAPHS and equality != "structural"]
    ]  # fmt: skip


@pytest.mark.parametrize(("model", "target", "module_equality"), _equality_rows())
def test_equals_upstream_extraction(model: str, target: str, module_equality: str) -> None:
    expected = oracles.meta_schedule(model, target, module_equality)
    mod, params = load(model)
    actual = extract_task_from_relay(mod, target, params, module_equality=module_equality)
    assert_same_extracted_tasks(expected, actual)


def test_tasks_are_tunable_extracted_tasks(tmp_path) -> None:
    import tvm.tir.tensor_intrin.x86  # noqa: F401  (x86 schedule rules look these up)

    mod, params = load("dense_softmax")
    tasks = extract_task_from_relay(mod, f"{X86} -num-cores 2", params)
    contexts, weights = ms.relay_integration.extracted_tasks_to_tune_contexts(
        tasks, work_dir=str(tmp_path)
    )
    assert [int(w) for w in weights] == [t.weight for t in tasks]
    assert all(isinstance(t, ms.ExtractedTask) for t in tasks)
    assert [c.task_name for c in contexts] == [t.task_name for t in tasks]


def test_registry_rows_carry_the_native_tasks() -> None:
    mod, params = load("dense_softmax")
    rows = get_adapter("meta_schedule").extract(mod, X86, params)
    natives = extract_task_from_relay(mod, X86, params)
    assert [(r.name, r.weight) for r in rows] == [(t.task_name, t.weight) for t in natives]
    assert [r.anchor_op for r in rows] == ["nn.dense", "nn.dense", "nn.softmax"]


def test_unknown_module_equality_names_the_choices() -> None:
    mod, params = load("dense_softmax")
    with pytest.raises(ModelError, match="structural, ignore-ndarray, anchor-block"):
        extract_task_from_relay(mod, X86, params, module_equality="exact")


def test_pass_config_replaces_upstream_default_as_upstream_does() -> None:
    mod, params = load("conv_bias_bn_relu")
    config = {"relay.backend.use_meta_schedule": True, "relay.FuseOps.max_depth": 1}
    expected = ms.relay_integration.extract_tasks(
        load("conv_bias_bn_relu")[0], tvm.target.Target(X86), params, pass_config=config
    )
    actual = extract_task_from_relay(mod, X86, params, pass_config=config)
    assert_same_extracted_tasks(list(expected), actual)


def test_disabled_pass_and_opt_level_match_upstream() -> None:
    mod, params = load("conv_bias_bn_relu")
    expected = ms.relay_integration.extract_tasks(
        load("conv_bias_bn_relu")[0],
        tvm.target.Target(X86),
        params,
        opt_level=2,
        disabled_pass=["AlterOpLayout"],
    )
    actual = extract_task_from_relay(mod, X86, params, opt_level=2, disabled_pass=["AlterOpLayout"])
    assert_same_extracted_tasks(list(expected), actual)
    # At opt_level 3 AlterOpLayout runs (NCHWc convs) unless disabled: the argument must count.
    without = ms.relay_integration.extract_tasks(
        load("conv_bias_bn_relu")[0],
        tvm.target.Target(X86),
        params,
        disabled_pass=["AlterOpLayout"],
    )
    ours_without = extract_task_from_relay(mod, X86, params, disabled_pass=["AlterOpLayout"])
    assert_same_extracted_tasks(list(without), ours_without)
    default = extract_task_from_relay(mod, X86, params)
    assert [t.task_name for t in ours_without] != [t.task_name for t in default]


@pytest.mark.parametrize("target", [X86, CUDA])
def test_linked_params_equal_upstream(target: str) -> None:
    """With relay.FuseOps.link_params the weights are inside the tasks: all values must match."""
    config = {**DEFAULT_PASS_CONFIG, "relay.FuseOps.link_params": True}
    mod, params = load("conv_bias_bn_relu")
    expected = ms.relay_integration.extract_tasks(
        load("conv_bias_bn_relu")[0], tvm.target.Target(target), params, pass_config=config
    )
    assert any(_has_tensor_constant(t) for t in expected), "link_params linked no weights"
    actual = extract_task_from_relay(mod, target, params, pass_config=config)
    assert_same_extracted_tasks(list(expected), actual)


def _has_tensor_constant(task) -> bool:
    found: list[bool] = []
    for func in task.mod.functions.values():
        tvm.relay.analysis.post_order_visit(
            func,
            lambda n: (
                found.append(True)
                if isinstance(n, tvm.relay.Constant) and len(n.data.shape) > 0
                else None
            ),
        )
    return bool(found)


def _parallel_branches(op: str, branches: int) -> tuple[tvm.IRModule, dict]:
    """``branches`` equal-shaped convs (or denses) of one input, summed: what the
    CombineParallel* passes of opt_level 4 merge once there are at least three."""
    rng = np.random.default_rng(branches)
    if op == "conv2d":
        data, shape = relay.var("data", shape=(1, 8, 16, 16)), (8, 8, 1, 1)
        apply = lambda x, w: relay.nn.conv2d(x, w, channels=8, kernel_size=(1, 1))  # noqa: E731
    else:
        data, shape = relay.var("data", shape=(4, 16)), (16, 16)
        apply = relay.nn.dense
    weights = [relay.var(f"w{i}", shape=shape) for i in range(branches)]
    out = apply(data, weights[0])
    for w in weights[1:]:
        out = relay.add(out, apply(data, w))
    mod = tvm.IRModule.from_expr(relay.Function([data, *weights], out))
    params = {w.name_hint: rng.standard_normal(shape).astype("float32") for w in weights}
    return mod, params


@pytest.mark.parametrize("branches", [2, 3])
@pytest.mark.parametrize("op", ["conv2d", "dense"])
def test_parallel_branches_at_opt_level_4(op: str, branches: int) -> None:
    mod, params = _parallel_branches(op, branches)
    target = tvm.target.Target(X86)
    expected = ms.relay_integration.extract_tasks(mod, target, params, opt_level=4)
    actual = extract_task_from_relay(mod, target, params, opt_level=4)
    assert_same_extracted_tasks(expected, actual)
    at_3 = extract_task_from_relay(mod, target, params)
    combined = [t.task_name for t in actual] != [t.task_name for t in at_3]
    assert combined == (branches >= 3)  # the row proves what it is for


def _wide_blocks() -> tuple[tvm.IRModule, dict]:
    """repeated_blocks with 32 channels: each conv weight (9,216 values, and its NCHWc copy) is
    large enough for the last fold to defer it, unless FuseOps links it into the task."""
    rng = np.random.default_rng(11)
    data = relay.var("data", shape=(1, 32, 8, 8))
    out, params = data, {}
    for i in range(4):
        w = relay.var(f"w{i}", shape=(32, 32, 3, 3))
        conv = relay.nn.relu(relay.nn.conv2d(out, w, padding=(1, 1), kernel_size=(3, 3)))
        out = conv + out if i % 2 else conv
        params[f"w{i}"] = rng.standard_normal((32, 32, 3, 3)).astype("float32")
    free = relay.analysis.free_vars(out)
    return tvm.IRModule.from_expr(relay.Function(free, out)), params


@pytest.mark.parametrize("model", ["repeated_blocks", "wide_blocks"])
@pytest.mark.parametrize("target", [X86, CUDA])
def test_linked_params_make_ignore_ndarray_merge_blocks_that_differ_in_weights(
    target: str, model: str
) -> None:
    """With link-params (asked by the module's executor) the weights are constants inside the
    primitive functions, so the four equal conv blocks differ only in constant values:
    ``ignore-ndarray`` merges them (fewer tasks, larger weights) where ``structural`` does not,
    and the constants in each task are the weights' own values."""
    from zoo import copy_module

    mod, params = load(model) if model == "repeated_blocks" else _wide_blocks()
    mod = mod.with_attr("executor", relay.backend.Executor("graph", {"link-params": True}))
    counts = {}
    for equality in ("structural", "ignore-ndarray"):
        actual = extract_task_from_relay(mod, target, params, module_equality=equality)
        expected = ms.relay_integration.extract_tasks(
            copy_module(mod), tvm.target.Target(target), params, module_equality=equality
        )
        assert_same_extracted_tasks(expected, actual)
        counts[equality] = [int(t.weight) for t in actual]
    assert len(counts["ignore-ndarray"]) < len(counts["structural"])
    assert sum(counts["ignore-ndarray"]) == sum(counts["structural"])


@pytest.mark.parametrize("own", [None, "graph"])
def test_executor_argument_is_upstreams(own: str | None) -> None:
    """``executor=`` is attached as upstream attaches it: only to a module naming none (a
    module's own executor wins). With link-params asked through it the weights are inside the
    tasks, so the argument changes the answer and the comparison can tell."""
    from zoo import copy_module

    mod, params = load("repeated_blocks")
    if own:
        mod = mod.with_attr("executor", relay.backend.Executor(own))
    linked = relay.backend.Executor("graph", {"link-params": True})
    actual = extract_task_from_relay(mod, X86, params, executor=linked)
    expected = ms.relay_integration.extract_tasks(
        copy_module(mod), tvm.target.Target(X86), params, executor=linked
    )
    assert_same_extracted_tasks(expected, actual)
    plain = extract_task_from_relay(mod, X86, params)  # weights as params: equal blocks merge
    assert (len(actual) == len(plain)) == bool(own)


def test_measurements_are_read_from_metaschedules_own_database(tmp_path) -> None:
    """A database written through MetaSchedule's own API, in commit order: a valid record is its
    mean run time; a failure (no run time, or MetaSchedule's 1e10 s mark) takes the next cause
    from the error log, then "unknown error"; the key is the workload's structural hash."""
    from relay_tasks.adapters.meta_schedule import measurements
    from relay_tasks.adapters.meta_schedule.database import ERRORS as ERRORS_FILE

    mod, params = load("dense_softmax")
    rows = get_adapter("meta_schedule").extract(mod, X86, params)
    assert measurements(tmp_path) == []  # nothing tuned yet: no database
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    target = tvm.target.Target(X86)
    for row, run_secs in [(0, [1e-3, 4e-3]), (1, None), (0, [1e10]), (1, [2e-3]), (0, [1e10])]:
        prim = rows[row].native.dispatched[0]
        workload = database.commit_workload(prim)
        trace = tvm.tir.Schedule(prim).trace
        times = None if run_secs is None else [tvm.tir.FloatImm("float32", s) for s in run_secs]
        database.commit_tuning_record(ms.database.TuningRecord(trace, workload, times, target))
    (tmp_path / ERRORS_FILE).write_text('{"task": 1, "error": "no build"}\n\n'
                                        '{"task": 0, "error": "run failed"}\n')  # fmt: skip
    got = [(m.key, m.seconds, m.error) for m in measurements(tmp_path)]
    assert got == [
        (rows[0].key, pytest.approx(2.5e-3), ""),
        (rows[1].key, None, "no build"),
        (rows[0].key, None, "run failed"),
        (rows[1].key, pytest.approx(2e-3), ""),
        (rows[0].key, None, "unknown error"),
    ]
    assert (
        rows[0].key == f"{tvm.ir.structural_hash(rows[0].native.dispatched[0]) & (2**64 - 1):016x}"
    )


@pytest.mark.parametrize(
    ("report", "cause"),
    [
        (
            "Traceback:\n  File x\nRuntimeError: out of memory\n  cmd: gcc -o x",
            "RuntimeError: out of memory",
        ),
        ("first error\nsecond ERROR here\nlast", "second ERROR here"),
        ("no such word\n  timed out  \n", "timed out"),
        ("", ""),
        ("error " + "x" * 400, ("error " + "x" * 400)[:300]),
    ],
)
def test_the_cause_is_the_last_line_naming_an_error(report: str, cause: str) -> None:
    from relay_tasks.adapters.base import failure_cause

    assert failure_cause(report) == cause


@pytest.mark.xdist_group("tuning")
def test_tune_spends_the_budget_on_valid_measurements_and_builds_with_them(tmp_path) -> None:
    from tuned_models import assert_one_task_tunes_resumes_and_builds

    assert_one_task_tunes_resumes_and_builds("meta_schedule", tmp_path)


def test_a_resumed_tune_teaches_its_records_to_the_cost_model_and_draws_nothing_at_random(
    tmp_path, monkeypatch
) -> None:
    """MetaSchedule keeps no cost model between tunes: a resumed tune learns the work dir's
    records first and, where they are as many as the warm-up needs, searches with the model
    from its first candidate (it drew the warm-up's random candidates again before)."""
    from relay_tasks.adapters.base import Runner
    from relay_tasks.adapters.meta_schedule import session

    from tuned_models import tune_in_process

    tuned = tune_in_process("meta_schedule", tmp_path, [3])
    work = tmp_path / "work"
    learnt: list[int] = []
    drawn: list[int] = []
    learn = session._Session.learn
    monkeypatch.setattr(session._Session, "learn",
                        lambda self, *others: learnt.append(learn(self, *others)) or learnt[-1])  # fmt: skip
    monkeypatch.setattr(session, "_replay", lambda n: drawn.append(n))
    monkeypatch.setattr(session, "WARMUP", 3)
    adapter, (_, target, _, tasks) = get_adapter("meta_schedule"), tuned.inputs
    adapter.tune(tasks, target, 5, work, Runner())
    assert learnt == [3] and drawn == []
    valid = [m for m in adapter.measurements(work) if m.valid]
    assert len(valid) >= 5


def test_cpu_targets_get_this_machines_core_count_unless_they_name_one() -> None:
    """MetaSchedule's CPU schedule rules read ``-num-cores``; other targets are left alone."""
    import os

    from relay_tasks.adapters.meta_schedule.session import _with_num_cores

    host = "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"
    filled = _with_num_cores(tvm.target.Target(X86, host))
    assert int(filled.attrs["num-cores"]) == os.cpu_count()
    assert (str(filled.host), filled.attrs["mcpu"]) == (
        str(tvm.target.Target(host)),
        "skylake-avx512",
    )
    named = tvm.target.Target(f"{X86} -num-cores 7")
    assert _with_num_cores(named) is named
    cuda = tvm.target.Target(CUDA)
    assert _with_num_cores(cuda) is cuda


@pytest.mark.parametrize("tuner", ["meta_schedule", "ansor"])
def test_search_effort_grows_with_the_budget_within_upstreams_defaults(tuner: str) -> None:
    """A handful of trials gets a small population bred over 2 generations; from 64 trials on,
    4 generations, and the population reaches its ceiling and stays: a quarter of upstream's
    default, Ansor's 2048 and MetaSchedule's 512 (a round's search at upstream's costs two cores
    more than its builds and runs)."""
    import importlib

    search = importlib.import_module(f"relay_tasks.adapters.{tuner}.session")._search

    def effort(budget: int) -> tuple[int, int, int]:
        found = search(budget)
        if tuner == "ansor":
            keys = ("evolutionary_search_population", "evolutionary_search_num_iters",
                    "sample_init_min_population")  # fmt: skip
            return tuple(found[k] for k in keys)  # type: ignore[return-value]
        return (found.population_size, found.genetic_num_iters, found.init_min_unmeasured)

    ceiling = {"meta_schedule": 128, "ansor": 512}[tuner]
    budgets = [1, 2, 8, 63, 64, 200, 10_000]
    efforts = [effort(b) for b in budgets]
    populations = [p for p, _, _ in efforts]
    assert populations == sorted(populations) and populations[0] < populations[-1] == ceiling
    assert [g for _, g, _ in efforts] == [2, 2, 2, 2, 4, 4, 4]
    assert all(1 <= init <= min(50, p // 2) for p, _, init in efforts)
    assert effort(10_000)[2] == 50


def test_merging_one_task_of_several_models_sums_their_weights() -> None:
    """The same TIR in two models is one task: the first one's name, module, target and TIR,
    with the weights added."""
    from relay_tasks.adapters.meta_schedule import merge

    mod, params = load("repeated_blocks")
    first = max(get_adapter("meta_schedule").extract(mod, X86, params), key=lambda t: t.weight)
    again = max(get_adapter("meta_schedule").extract(mod, X86, params), key=lambda t: t.weight)
    merged = merge([first, again, first])
    assert merged.weight == 3 * first.weight and first.weight > 1
    assert (merged.task_name, merged.target) == (first.native.task_name, first.native.target)
    assert merged.mod.same_as(first.native.mod)
    assert [
        m.same_as(f) for m, f in zip(merged.dispatched, first.native.dispatched, strict=True)
    ] == [True]
    assert first.native.weight == first.weight  # the rows themselves are not changed


def test_task_payloads_derive_the_same_task_here() -> None:
    """A task file's payload is the primitive function: lowered here, it gives the extracted
    task back (Relay module and TIR structurally equal), named and weighted as the file says;
    a payload with TIR beside its function is refused, not compiled."""
    from relay_tasks.adapters.meta_schedule import decode, encode

    mod, params = load("dense_softmax")
    target = tvm.target.Target(X86)
    for task in get_adapter("meta_schedule").extract(mod, target, params):
        back, _ = decode(encode(task), target, task.name, task.weight)
        assert (back.task_name, back.weight, str(back.target)) == (
            task.name,
            task.weight,
            str(target),
        )
        assert tvm.ir.structural_equal(back.mod, task.native.mod)
        assert len(back.dispatched) == len(task.native.dispatched) == 1
        assert tvm.ir.structural_equal(back.dispatched[0], task.native.dispatched[0])
    with pytest.raises(ValueError, match="^its payload holds 'dispatched', which it may not$"):
        decode({**encode(task), "dispatched": []}, target, task.name, 1)


_KILLED_AT_THE_THIRD_RESULT = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tvm.meta_schedule.runner.local_runner import LocalRunnerFuture
import relay_tasks
from relay_tasks.adapters import get_adapter
from relay_tasks.adapters.base import Runner
from zoo import load

futures, made = LocalRunnerFuture._cls, []
start = futures.__init__
def measured(self, *args, **kwargs):  # a measurement's result, as the runner gets it
    made.append(self)
    if len(made) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    start(self, *args, **kwargs)
futures.__init__ = measured
adapter, target = get_adapter("meta_schedule"), relay_tasks.host_target()
mod, params = load("dense_softmax")
tasks = adapter.extract(mod, target, params)
adapter.tune(tasks, target, 30, Path(sys.argv[1]), Runner())
"""


@pytest.mark.xdist_group("tuning")
def test_each_measurement_is_on_disk_as_it_completes(tmp_path) -> None:
    """Killed (SIGKILL, nothing to tidy) as its third measurement completes, in the first batch
    of a three-task model: the two before it are in the database. MetaSchedule's own runner
    measures a whole batch before it returns, and its scheduler commits that batch only once
    every task has had its first batch measured (a candidate that fails to build is recorded
    without a measurement)."""
    import subprocess
    import sys
    from pathlib import Path

    from tuned_models import raw_measurements

    tests = str(Path(__file__).parents[1])
    killed = subprocess.run([sys.executable, "-c", _KILLED_AT_THE_THIRD_RESULT, str(tmp_path),
                             tests], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    records = raw_measurements(tmp_path, "meta_schedule")
    # A candidate that failed to build never reached the runner: its failure is recorded too.
    # One that ran but computes something else (TVM miscompiles some of this model's first
    # task, drawn at random) was measured, and is filed as a failure with its own cause.
    valid = [s for _, s in records if s is not None]
    kept = tmp_path / ERRORS
    lines = kept.read_text().splitlines() if kept.exists() else []
    causes = [json.loads(line)["error"] for line in lines]
    miscompiled = causes.count(WRONG)
    assert len(valid) + miscompiled == 2 and all(0 < s < 1 for s in valid), (records, causes)


_DESIGN_SPACE = """
import sys
import relay_tasks
import tvm
from tvm import meta_schedule as ms, relay
from relay_tasks.adapters import get_adapter
from relay_tasks.adapters.meta_schedule import register_intrinsics

target = tvm.target.Target(sys.argv[1])
x, w = relay.var("x", shape=(64, 64), dtype="float16"), relay.var("w", shape=(64, 64), dtype="float16")
mod = tvm.IRModule.from_expr(relay.Function([x, w], relay.nn.dense(x, w)))
[task] = get_adapter("meta_schedule").extract(mod, target, {})
register_intrinsics(target)
context = ms.TuneContext(mod=task.native.dispatched[0], target=target, task_name=task.name,
                         space_generator="post-order-apply", search_strategy="replay-trace")
assert context.generate_design_space()
print([m for m in ("arm_cpu", "cuda", "rocm", "x86") if f"tvm.tir.tensor_intrin.{m}" in sys.modules])
"""


@pytest.mark.parametrize(
    ("target", "modules"),
    [
        (f"{X86} -num-cores 2", ["arm_cpu", "x86"]),
        ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod -num-cores 2", ["arm_cpu", "x86"]),
        (f"{CUDA} -max_threads_per_block=1024 -max_shared_memory_per_block=49152", ["cuda"]),
    ],
    ids=["x86", "aarch64", "cuda"],
)
def test_the_schedule_rules_find_their_intrinsics_and_only_the_targets_are_imported(
    target: str, modules: list[str]
) -> None:
    """MetaSchedule's rules look tensor intrinsics up by name (x86's VNNI dot product, Arm's
    NEON one, CUDA's wmma), which hhb-tvm leaves unregistered: without them a tune fails at
    its first task. Only the target's are imported, in a fresh process: CUDA's took 3 of the
    4 s a tune of an x86 model spent importing all of them."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _DESIGN_SPACE, target],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(modules)


def test_a_task_starts_from_the_best_schedules_of_its_nearest_similar_tasks() -> None:
    """Tutors of the same operators (the task name less its shape number), nearest in buffer
    shapes first (a dense of about the same FLOPs but other shapes after one of 1.5 times
    the FLOPs), at most ``STARTS_EACH`` records of each, their fastest valid ones; another
    operator's records and the task's own give none."""
    from relay_tasks import host_target
    from relay_tasks.adapters.meta_schedule import register_intrinsics
    from relay_tasks.adapters.meta_schedule.session import (
        STARTS,
        STARTS_EACH,
        _starts,
        _with_num_cores,
    )

    adapter, target = get_adapter("meta_schedule"), host_target()
    register_intrinsics(target)

    def task(rows: int, depth: int, relu: bool = True):
        data, weight = relay.var("x", shape=(rows, depth)), relay.var("w", shape=(16, depth))
        body = relay.nn.dense(data, weight)
        body = relay.nn.relu(body) if relu else body
        mod = tvm.IRModule.from_expr(relay.Function([data, weight], body))
        w = np.ones((16, depth), "float32")
        [found] = adapter.extract(mod, target, {"w": w})
        return found

    me, near, decoy, far = task(2, 32), task(3, 32), task(1, 64), task(16, 32)
    other = task(3, 32, relu=False)
    assert len({t.native.task_name for t in (me, near, decoy, far, other)}) == 2
    size = {t.key: adapter.flops(t.native) for t in (me, near, decoy)}
    assert abs(size[decoy.key] - size[me.key]) < abs(size[near.key] - size[me.key]) / 10
    memory = ms.database.MemoryDatabase()
    origin = {}
    for tutor in (me, near, decoy, far, other):
        module = tutor.native.dispatched[0]
        context = ms.TuneContext(mod=module, target=_with_num_cores(target),
                                 space_generator="post-order-apply",
                                 search_strategy="replay-trace", num_threads=1)  # fmt: skip
        workload = memory.commit_workload(module)
        info = ms.arg_info.ArgInfo.from_entry_func(module, remove_preproc=True)
        for n, space in enumerate(context.generate_design_space()[:3]):
            secs = 1e10 if n == 0 else 1e-5 * n  # MetaSchedule's mark of a failed measurement
            memory.commit_tuning_record(ms.database.TuningRecord(
                space.trace, workload, [tvm.tir.FloatImm("float32", secs)], target, info))  # fmt: skip
            origin[str(space.trace)] = (tutor.key, n)
    tutors = [(t, memory) for t in (other, far, decoy, near, me)]
    starts = _starts([me], tutors)
    assert [origin[str(t)] for t in starts[me.key]] == [
        (near.key, 1), (near.key, 2), (decoy.key, 1), (decoy.key, 2), (far.key, 1)
    ][:STARTS] and STARTS_EACH == 2  # fmt: skip
    assert _starts([other], [(t, memory) for t in (me, near, decoy)]) == {}
