"""The drop-in: upstream's entry points run on relay-tasks, and real tuning scripts still work."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import auto_scheduler, autotvm, relay
from tvm import meta_schedule as ms
from tvm.contrib import graph_executor

import relay_tasks

from checks import assert_same_extracted_tasks
from zoo import X86, load


def _entry_points() -> list:
    return [
        ms.relay_integration.extract_tasks,
        autotvm.task.extract_from_program,
        autotvm.task.relay_integration.extract_from_program,
        autotvm.task.extract_from_multiple_program,
        auto_scheduler.extract_tasks,
        auto_scheduler.relay_integration.extract_tasks,
    ]


def test_install_replaces_and_uninstall_restores() -> None:
    originals = _entry_points()
    relay_tasks.install()
    relay_tasks.install()  # idempotent
    try:
        replaced = _entry_points()
        assert all(new is not old for new, old in zip(replaced, originals, strict=True))
        assert all(new.__wrapped__ is old for new, old in zip(replaced, originals, strict=True))
    finally:
        relay_tasks.uninstall()
    assert all(new is old for new, old in zip(_entry_points(), originals, strict=True))
    with relay_tasks.installed():
        assert ms.relay_integration.extract_tasks is not originals[0]
    assert ms.relay_integration.extract_tasks is originals[0]


def _names_of(functions: list) -> set[tuple[str, str]]:
    """Every (module, attribute) among TVM's loaded modules that holds one of ``functions``:
    found by scanning, not from a list, so a re-export nobody wrote down counts too."""
    import sys

    wanted = {id(f) for f in functions}
    return {
        (name, attr)
        for name, module in list(sys.modules.items())
        if name.startswith("tvm.") and module is not None
        for attr, value in list(vars(module).items())
        if id(value) in wanted
    }


def test_every_name_of_an_upstream_extractor_is_replaced_and_restored() -> None:
    originals = _entry_points()
    names = _names_of(originals)
    assert len(names) >= 7  # the three extractors and their package re-exports
    with relay_tasks.installed():
        assert _names_of(originals) == set()  # not one name still reaches upstream's own
    assert _names_of(originals) == names


def test_installed_entry_points_equal_the_originals() -> None:
    ms_up, at_up, _, at_multi_up, ansor_up, _ = _entry_points()
    mod, params = load("conv_bias_bn_relu")
    target = tvm.target.Target(X86)
    expected_ms = ms_up(load("conv_bias_bn_relu")[0], target, params)
    expected_at = at_up(load("conv_bias_bn_relu")[0]["main"], params, target)
    expected_multi = at_multi_up(
        [load("conv_bias_bn_relu")[0]["main"], load("dense_softmax")[0]["main"]],
        [params, load("dense_softmax")[1]],
        target,
    )
    expected_ansor, expected_weights = ansor_up(
        load("conv_bias_bn_relu")[0]["main"], params, target
    )
    with relay_tasks.installed():
        actual_ms = ms.relay_integration.extract_tasks(mod, target, params)
        actual_at = autotvm.task.extract_from_program(mod["main"], params, target)
        actual_multi = autotvm.task.extract_from_multiple_program(
            [mod["main"], load("dense_softmax")[0]["main"]],
            [params, load("dense_softmax")[1]],
            target,
        )
        actual_ansor, actual_weights = auto_scheduler.extract_tasks(mod["main"], params, target)
    assert_same_extracted_tasks(list(expected_ms), list(actual_ms))
    assert [(t.name, t.args) for t in actual_at] == [(t.name, t.args) for t in expected_at]
    assert [(t.name, t.args) for t in actual_multi] == [(t.name, t.args) for t in expected_multi]
    assert [t.workload_key for t in actual_ansor] == [t.workload_key for t in expected_ansor]
    assert actual_weights == expected_weights


@pytest.mark.parametrize("kind", ["none-match", "some-match"])
def test_params_upstream_does_not_bind_are_ignored_as_upstream_ignores_them(kind: str) -> None:
    """Upstream binds by name what matches and ignores the rest; the house API warns (some) or
    refuses (none), the drop-in neither: same tasks as upstream, no warning."""
    mod, params = load("dense_softmax")
    counter = {"bn.num_batches_tracked": np.zeros((), "int64")}
    odd = counter if kind == "none-match" else {**params, **counter}
    target = tvm.target.Target(X86)
    calls = {
        "meta_schedule": lambda extract: [
            (t.task_name, int(t.weight), t.dispatched[0])
            for t in extract(load("dense_softmax")[0], target, odd)
        ],
        "autotvm": lambda extract: [
            (t.name, t.args) for t in extract(load("dense_softmax")[0]["main"], odd, target)
        ],
        "autotvm-multiple": lambda extract: [
            (t.name, t.args)
            for t in extract([load("dense_softmax")[0], mod], [odd, odd, odd], target)
        ],
        "ansor": lambda extract: [
            (t.workload_key, w)
            for t, w in zip(*extract(load("dense_softmax")[0], odd, target), strict=True)
        ],
    }

    def each(entry_points: list) -> dict[str, list]:
        ms_extract, at_extract, _, at_multi_extract, ansor_extract, _ = entry_points
        extractors = (ms_extract, at_extract, at_multi_extract, ansor_extract)
        return {tuner: call(f) for (tuner, call), f in zip(calls.items(), extractors, strict=True)}

    expected = each(_entry_points())
    with relay_tasks.installed(), warnings.catch_warnings():
        warnings.simplefilter("error", relay_tasks.UnusedParamsWarning)
        actual = each(_entry_points())
    assert all(expected.values())
    for tuner, rows in expected.items():
        assert len(actual[tuner]) == len(rows), tuner
        for ours, theirs in zip(actual[tuner], rows, strict=True):
            assert tvm.ir.structural_equal(ours, theirs), (tuner, ours, theirs)


def test_installed_meta_schedule_takes_upstreams_executor_argument() -> None:
    """Linked params through ``executor=`` put the weights inside the tasks (4 equal blocks
    stay 4 tasks); the drop-in must hand the argument on."""
    ms_up = _entry_points()[0]
    linked = relay.backend.Executor("graph", {"link-params": True})
    params = load("repeated_blocks")[1]
    expected = ms_up(load("repeated_blocks")[0], tvm.target.Target(X86), params, executor=linked)
    with relay_tasks.installed():
        actual = ms.relay_integration.extract_tasks(
            load("repeated_blocks")[0], tvm.target.Target(X86), params, executor=linked
        )
    assert_same_extracted_tasks(list(expected), list(actual))


def _run(lib, mod: tvm.IRModule) -> np.ndarray:
    module = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    shape = [int(d) for d in mod["main"].params[0].checked_type.shape]
    module.set_input("data", np.random.default_rng(0).standard_normal(shape).astype("float32"))
    module.run()
    return module.get_output(0).numpy()


@pytest.fixture()
def reference() -> tuple[tvm.IRModule, dict, np.ndarray]:
    mod, params = load("dense_softmax")
    mod = relay.transform.InferType()(mod)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=relay_tasks.host_target(), params=params)
    return mod, params, _run(lib, mod)


def test_an_autotvm_tuning_script_runs_unchanged(reference, tmp_path) -> None:
    """An upstream script measuring through an RPC tracker (AutoTVM's LocalRunner cannot measure
    on hhb-tvm at all: its stock server cannot load what the client sends); the device is
    relay-tasks' fixed server, as ``relay-tasks serve`` runs it."""
    from relay_tasks.rpc import start_server, start_tracker

    mod, params, expected = reference
    target, log = relay_tasks.host_target(), str(tmp_path / "autotvm.log")
    tracker = start_tracker()
    server = start_server(("127.0.0.1", tracker.port), "dropin", port=9500)
    try:
        with relay_tasks.installed():
            # --- an unmodified AutoTVM tuning script ---
            tasks = autotvm.task.extract_from_program(mod["main"], target=target, params=params)
            measure = autotvm.measure_option(
                builder=autotvm.LocalBuilder(timeout=60),
                runner=autotvm.RPCRunner(
                    "dropin", "127.0.0.1", tracker.port, number=1, repeat=1, timeout=60
                ),
            )
            for task in tasks[:2]:
                tuner = autotvm.tuner.RandomTuner(task)
                tuner.tune(
                    n_trial=3, measure_option=measure, callbacks=[autotvm.callback.log_to_file(log)]
                )
            with autotvm.apply_history_best(log), tvm.transform.PassContext(opt_level=3):
                lib = relay.build(mod, target=target, params=params)
            # ---
    finally:
        server.terminate()
        tracker.terminate()
    assert len(tasks) >= 2
    results = [record[1] for record in autotvm.record.load_from_file(log)]
    assert len(results) == 6
    assert all(r.error_no == 0 and 0 < np.mean(r.costs) < 1 for r in results)  # valid
    np.testing.assert_allclose(_run(lib, mod), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # 70 s: Ansor's own tuning loop; tests/tuning tunes with Ansor in the default run
def test_an_ansor_tuning_script_runs_unchanged(reference, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the script's task scheduler writes total_latency.tsv here
    mod, params, expected = reference
    target, log = relay_tasks.host_target(), str(tmp_path / "ansor.json")
    with relay_tasks.installed():
        # --- an unmodified Ansor tuning script ---
        tasks, weights = auto_scheduler.extract_tasks(mod["main"], params, target)
        tuner = auto_scheduler.TaskScheduler(tasks[:2], weights[:2])
        tuner.tune(
            auto_scheduler.TuningOptions(
                num_measure_trials=4,
                runner=auto_scheduler.LocalRunner(repeat=1, timeout=20),
                measure_callbacks=[auto_scheduler.RecordToFile(log)],
            )
        )
        with (
            auto_scheduler.ApplyHistoryBest(log),
            tvm.transform.PassContext(
                opt_level=3, config={"relay.backend.use_auto_scheduler": True}
            ),
        ):
            lib = relay.build(mod, target=target, params=params)
        # ---
    assert len(tasks) >= 2
    results = [result for _, result in auto_scheduler.load_records(log)]
    valid = [r for r in results if r.error_no == 0 and 0 < np.mean([float(c) for c in r.costs]) < 1]
    assert len(results) >= 4 and valid  # measured, and some measurements are valid
    np.testing.assert_allclose(_run(lib, mod), expected, rtol=1e-4, atol=1e-5)


def test_a_meta_schedule_tuning_script_runs_unchanged(reference, tmp_path) -> None:
    import tvm.tir.tensor_intrin.x86

    mod, params, expected = reference
    target = tvm.target.Target(f"{relay_tasks.host_target()} -num-cores 2")
    with relay_tasks.installed():
        # --- an unmodified MetaSchedule tuning script ---
        extracted = ms.relay_integration.extract_tasks(mod, target, params)
        contexts, weights = ms.relay_integration.extracted_tasks_to_tune_contexts(
            extracted[:2], work_dir=str(tmp_path)
        )
        database = ms.tune_tasks(
            tasks=contexts,
            task_weights=weights,
            work_dir=str(tmp_path),
            max_trials_global=4,
            num_trials_per_iter=2,
        )
        lib = ms.relay_integration.compile_relay(database, mod, target, params)
        # ---
    assert len(extracted) >= 2
    records = database.get_all_tuning_records()
    seconds = [np.mean([float(s) for s in record.run_secs]) for record in records]
    assert len(records) >= 2 and all(0 < s < 1 for s in seconds)  # valid measurements only
    # TVM's code for a schedule can compute something else (relay_tasks/adapters/verify.py),
    # and upstream's compile_relay applies the best record unchecked: where one of them does,
    # the script's model is TVM's wrong answer, not the drop-in's.
    if all(_computes_its_task(record, target) for record in records):
        np.testing.assert_allclose(_run(lib, mod), expected, rtol=1e-4, atol=1e-5)


def _computes_its_task(record: Any, target: Any) -> bool:
    from relay_tasks.adapters.meta_schedule.library import _scheduled
    from relay_tasks.adapters.verify import same_results

    return same_results(record.workload.mod, _scheduled(record), target)


@pytest.mark.parametrize("tuner", ["meta_schedule", "autotvm", "ansor"])
def test_errors_reach_scripts_that_catch_tvm_errors(tuner: str, monkeypatch) -> None:
    """Upstream raises ``tvm.TVMError`` where relay-tasks raises its own errors: through the
    drop-in, ours are both, so ``except tvm.TVMError`` in an existing script still catches them."""
    from relay_tasks import dropin

    monkeypatch.setattr(dropin, "_BOTH", {})  # the combined classes are made on first use
    mod, params = load("dense_softmax")
    wrong = {**params, "w1": np.zeros(3, "float32")}  # upstream fails too, in its type checker
    target = tvm.target.Target(X86)
    with relay_tasks.installed():
        extract = {
            "meta_schedule": lambda: ms.relay_integration.extract_tasks(mod, target, wrong),
            "autotvm": lambda: autotvm.task.extract_from_program(mod["main"], wrong, target),
            "ansor": lambda: auto_scheduler.extract_tasks(mod["main"], wrong, target),
        }[tuner]
        with pytest.raises(tvm.TVMError) as caught:
            extract()
    assert isinstance(caught.value, relay_tasks.ModelError)
    assert "param 'w1' is 3 float32, but main declares 'w1' as" in str(caught.value)
    shown = type(caught.value)
    assert (shown.__name__, shown.__module__) == ("ModelError", "relay_tasks.errors")
    assert list(dropin._BOTH) == [relay_tasks.ModelError]


def test_installing_inside_an_installed_block_keeps_it_installed() -> None:
    from relay_tasks import dropin

    originals = _entry_points()
    relay_tasks.install()
    try:
        assert dropin.is_installed()
        with relay_tasks.installed():
            pass
        assert dropin.is_installed()
        assert ms.relay_integration.extract_tasks is not originals[0]
    finally:
        relay_tasks.uninstall()
    assert not dropin.is_installed()


@pytest.mark.parametrize(
    "name",
    sorted(  # every error class (TuningInterrupted comes from tuning, never from extraction)
        c.__name__
        for c in relay_tasks.RelayTasksError.__subclasses__()
        if c is not relay_tasks.errors.TuningInterrupted
    ),
)
def test_every_error_of_ours_reaches_tvm_error_handlers(name: str, monkeypatch) -> None:
    """Every error class of ours combines with TVMError (ImportError's DependencyError too), once
    per class, with its message and its own class kept."""
    from relay_tasks import dropin

    monkeypatch.setattr(dropin, "_BOTH", {})
    cls = getattr(relay_tasks.errors, name)

    def extract(*args, **kwargs):
        raise cls("the message")

    wrapped = dropin._upstream_errors(extract)
    raised = []
    for _ in range(2):
        with pytest.raises(tvm.TVMError) as caught:
            wrapped()
        raised.append(type(caught.value))
        assert isinstance(caught.value, cls) and str(caught.value) == "the message"
    assert raised[0] is raised[1] and list(dropin._BOTH) == [cls]
