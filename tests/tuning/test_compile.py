"""``relay-tasks compile``: the records reach the build, the library runs, outputs agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relay

import relay_tasks
from relay_tasks.cli import main
from relay_tasks.loaders import load_model
from relay_tasks.tuning import compile as building

from tuned_models import TUNERS, raw_measurements

_NUMBER = r"[0-9.]+(e-[0-9]+)?"
_TIMING = rf"{_NUMBER} ms \(middle half {_NUMBER}-{_NUMBER}, 20 repeats\)"
_VERDICT = r"tuned is [0-9.]+x (faster|slower)|no difference beyond the spread of the repeats"
BENCHMARK_LINE = (
    rf"tuned {_TIMING}, untuned {_TIMING}: ({_VERDICT}); outputs differ by at most [0-9.e-]+"
)


@pytest.mark.parametrize("tuner", ["meta_schedule", "autotvm", "ansor"])
def test_compile_with_the_records(tuner: str, tuned: dict[str, Path], tiny, tmp_path, capsys):
    text, params = tiny
    work, library = tuned[tuner], tmp_path / "model.tar"
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work)]
    assert main([*argv, "-o", str(library), "--benchmark"]) == 0
    out, err = capsys.readouterr()
    mod, weights = load_model(text, params=params)
    chosen = building.plan(mod, weights, work)
    assert chosen.tuned == chosen.tasks  # every task was measured, so every task is covered
    count = len(chosen.tasks)
    assert err.startswith(f"relay-tasks: the records cover {count} of the model's {count} tasks")
    lines = err.splitlines()
    assert lines[0] == f"relay-tasks: {chosen.describe()}"  # and which are slower than the default
    # TVM's two warnings per function built without a record (MetaSchedule's), as one line
    without = [t for t in chosen.tasks if t not in chosen.applied]
    folded = (f"relay-tasks: built {len(without)} function(s) without a record, as said above "
              f"(TVM's messages: {work / 'tune.log'})")  # fmt: skip
    # Where the tiny model's untuned build timed faster beyond the spread, it was written.
    slower = "x slower" in out.splitlines()[1]
    wrote = [line for line in lines[1:] if line.startswith("relay-tasks: wrote the untuned build")]
    assert len(wrote) == slower
    rest = [line for line in lines[1:] if line not in wrote]
    assert rest == ([folded] if without and tuner == "meta_schedule" else [])
    assert out.splitlines()[0].endswith(f"{count}/{count} tasks tuned, library in {library}")
    assert re.fullmatch(BENCHMARK_LINE, out.splitlines()[1])
    # The exported library runs and computes what the untuned build computes.
    inputs = building.random_inputs(mod, weights)
    factory = tvm.runtime.load_module(str(library))
    untuned = building.build_untuned(mod, weights, chosen.target)
    tuned_run, untuned_run = building.compare([factory, untuned], inputs, repeat=1)
    assert building.max_difference(tuned_run.outputs, untuned_run.outputs) < 1e-4
    reference = np.maximum(inputs["data"] @ weights["w"].numpy().T, 0)
    np.testing.assert_allclose(tuned_run.outputs[0], reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("tuner", "default"),
    [("meta_schedule", 1e-9), ("autotvm", 1e-9), ("ansor", 1e-9), ("meta_schedule", 1e3)],
)
def test_records_slower_than_the_default_schedule_are_not_built(
    tuner, default, tuned, tiny, tmp_path, capsys
) -> None:
    """The worker measured each task's default latency; compile applies a task's records only
    where their best beats it (here made 1 ns, then 1000 s)."""
    import json
    import shutil

    from relay_tasks.tuning.defaults import DEFAULTS_FILE, read_defaults

    text, params = tiny
    mod, weights = load_model(text, params=params)
    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    measured = read_defaults(work)
    groups = {t.alternatives_of for t in building.plan(mod, weights, work).tasks}
    assert set(measured) == groups and all(0 < s < 1 for s in measured.values())
    lines = [json.dumps({"task": key, "seconds": default}) for key in groups]
    (work / DEFAULTS_FILE).write_text("".join(line + "\n" for line in lines))
    chosen = building.plan(mod, weights, work)
    assert chosen.slower == (chosen.tasks if default < 1 else [])
    assert chosen.applied == ([] if default < 1 else chosen.tasks)
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(tmp_path / "m.tar")]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert ("slower than TVM's default schedule (built with it): " in err) == (default < 1)


@pytest.mark.parametrize("tuner", ["meta_schedule", "ansor"])
def test_a_record_slower_than_the_default_timed_alike_is_not_built(
    tuner, tuned, tiny, tmp_path, monkeypatch
) -> None:
    """The tuner measured its records on data of its own; compile times each record it would
    apply as the default was timed (:func:`record_seconds`) and builds the default where the
    record loses there. The default here made 1000 s, which every record beats as measured;
    timed alike, the record made to take 10000 s, then 1 ps."""
    import json
    import shutil

    from relay_tasks.tuning.defaults import DEFAULTS_FILE, VERSION

    mod, weights = load_model(tiny[0], params=tiny[1])
    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    groups = {t.alternatives_of for t in building.plan(mod, weights, work).tasks}
    lines = [json.dumps({"task": key, "seconds": 1e3, "version": VERSION}) + "\n" for key in groups]
    (work / DEFAULTS_FILE).write_text("".join(lines))
    timed: list[str] = []

    def seconds(adapter, task, target, work_dir, best) -> float:
        timed.append(task.key)
        return taken

    monkeypatch.setattr(building, "record_seconds", seconds)
    taken = 1e4
    chosen = building.plan(mod, weights, work)
    assert timed == [t.key for t in chosen.tasks]  # each task with records, once
    assert chosen.slower == chosen.tasks and chosen.applied == []
    taken = 1e-12
    assert [t.key for t in building.plan(mod, weights, work).applied] == timed[:1]


def test_a_records_time_alike_is_its_build_timed_as_the_default_is(tuned, tiny, tmp_path):
    """record_seconds builds the task alone with its records (the build uses them: no
    warning) and times it; a task whose records the build cannot use has no such time."""
    import shutil
    from dataclasses import replace

    from relay_tasks.tuning.defaults import record_seconds

    mod, weights = load_model(tiny[0], params=tiny[1])
    work = tmp_path / "work"
    shutil.copytree(tuned["meta_schedule"], work)
    chosen = building.plan(mod, weights, work)
    (task,) = chosen.tasks
    assert 0 < record_seconds(chosen.adapter, task, chosen.target, work, 1e-3) < 1
    x, v = relay.var("data", shape=(1, 32)), relay.var("v", shape=(8, 32))
    other = tvm.IRModule.from_expr(relay.Function([x, v], relay.nn.dense(x, v)))
    (their,) = chosen.adapter.extract(other, chosen.target, {})
    moved = replace(task, source=their.source)  # its records, another function
    assert record_seconds(chosen.adapter, moved, chosen.target, work, 2e-3) is None


def test_a_record_is_timed_alike_once_while_it_is_the_best(tuned, tiny, tmp_path, monkeypatch):
    """The time is kept in the work dir for the best the tuner measured: the next plan
    reads it (two timings of a record close to the default disagree, and a work dir builds
    a model one way); a new best is timed anew, and a line naming it is read back exactly."""
    import json
    import shutil

    from relay_tasks.tuning import defaults
    from relay_tasks.tuning.defaults import DEFAULTS_FILE, VERSION, read_defaults, record_seconds

    mod, weights = load_model(tiny[0], params=tiny[1])
    work = tmp_path / "work"
    shutil.copytree(tuned["meta_schedule"], work)
    before = read_defaults(work)
    first = building.plan(mod, weights, work)
    (task,) = first.tasks
    timed: list[list[object]] = []
    monkeypatch.setattr(defaults, "_alone", lambda *args: timed.append(list(args)) or 5.0)
    assert building.plan(mod, weights, work).describe() == first.describe()
    assert timed == [] and read_defaults(work) == before  # the kept time is not a default
    adapter, target = first.adapter, first.target
    assert record_seconds(adapter, task, target, work, 1.25e-3) == 5.0 and len(timed) == 1
    assert record_seconds(adapter, task, target, work, 1.25e-3) == 5.0 and len(timed) == 1
    last = json.loads((work / DEFAULTS_FILE).read_text().splitlines()[-1])
    assert last == {"task": task.key, "best": 1.25e-3, "seconds": 5.0, "version": VERSION}


def test_a_tasks_default_is_what_its_tuners_build_gives_it_without_records(tiny, tmp_path):
    """The default is measured on the tuner's own build with no records (under MetaSchedule
    TOPI's dense there, not the naive one left for the tuner: relay_tasks/adapters/untuned.py),
    its weight a constant as in the model, once per work dir."""
    from dataclasses import replace

    import relay_tasks
    from relay_tasks.adapters import get_adapter
    from relay_tasks.tuning.defaults import measure_defaults, read_defaults, weight_params

    adapter, target = get_adapter("meta_schedule"), relay_tasks.host_target()
    mod, params = load_model(tiny[0], params=tiny[1])
    tasks = adapter.extract(mod, target, params)
    built: list[tuple[object, list[object]]] = []

    def build(mod, target, params, work_dir, chosen):
        built.append((work_dir, list(chosen)))
        return adapter.build(mod, target, params, work_dir, chosen)

    measure_defaults(replace(adapter, build=build), tasks, target, tmp_path)
    measure_defaults(replace(adapter, build=build), tasks, target, tmp_path)  # kept: not again
    assert built == [(tmp_path, [])]
    assert set(read_defaults(tmp_path)) == {tasks[0].alternatives_of}
    assert weight_params(tasks[0].source.func, tasks[0].source.lowered) == {1}  # dense's weight


@pytest.mark.parametrize("tuner", TUNERS)
@pytest.mark.parametrize("batch", [1, 8])
def test_every_tuners_dense_is_timed_by_default_with_its_weight_a_constant(
    tuner: str, batch: int, tmp_path
) -> None:
    """The weight is found in each tuner's compute: MetaSchedule's and Ansor's mark it
    layout-free, AutoTVM's dense packs it (timed as an input, the default repacked it on
    every run: BERT-2's FFN dense 0.75 ms against 0.30 in the model)."""
    import relay_tasks
    from relay_tasks.adapters import get_adapter
    from relay_tasks.tuning.defaults import weight_params

    from tuned_models import write_tiny

    text, weights = write_tiny(tmp_path, batch=batch)
    mod, params = load_model(text, params=weights)
    tasks = get_adapter(tuner).extract(mod, relay_tasks.host_target(), params)
    assert tasks and {weight_params(t.source.func, t.source.lowered) for t in tasks} == {
        frozenset({1})
    }


@pytest.mark.parametrize("tuner", TUNERS)
def test_every_tuners_convolution_is_timed_by_default_with_its_weight_a_constant(tuner) -> None:
    """AutoTVM's ``conv2d_NCHWc``, traced without AlterOpLayout, packs its weight in a compute
    of its own (``kernel_vec``) and marks nothing layout-free: found there, it is a constant
    when the default is timed. Timed as an input, the weight was packed again on every run, 1.5 of the 3.7 ms ResNet-18's 512-channel convolution took
    by default, and a record AutoTVM measured at 2.0 ms took 5.0."""
    import numpy as np
    from tvm import relay

    import relay_tasks
    from relay_tasks.adapters import get_adapter
    from relay_tasks.tuning.defaults import weight_params

    data, weight = relay.var("data", shape=(1, 16, 8, 8)), relay.var("w", shape=(32, 16, 3, 3))
    body = relay.nn.relu(relay.nn.conv2d(data, weight, padding=(1, 1), channels=32,
                                         kernel_size=(3, 3)))  # fmt: skip
    mod = tvm.IRModule.from_expr(relay.Function([data, weight], body))
    params = {"w": np.random.default_rng(0).standard_normal((32, 16, 3, 3)).astype("float32")}
    tasks = get_adapter(tuner).extract(mod, relay_tasks.host_target(), params)
    (conv,) = [t for t in tasks if "conv2d" in t.anchor_op]
    if tuner == "autotvm":
        assert weight_params(conv.source.func, conv.source.lowered) == frozenset({1})
    else:  # AlterOpLayout ran before the extraction: the weight comes packed, as in the model
        assert len(conv.source.func.params[1].checked_type.shape) == 6


def test_a_default_a_tune_beside_measured_meanwhile_is_kept_once(tiny, tmp_path, monkeypatch):
    """Two tunes of one work dir measure the defaults at once: the one that ends second
    keeps the first one's line (read under the lock), and skips what it already finds."""
    import json

    import relay_tasks
    from relay_tasks.adapters import get_adapter
    from relay_tasks.tuning import defaults

    adapter, target = get_adapter("meta_schedule"), relay_tasks.host_target()
    mod, params = load_model(tiny[0], params=tiny[1])
    tasks = adapter.extract(mod, target, params)
    (key,) = {t.alternatives_of for t in tasks}
    beside = json.dumps({"task": key, "seconds": 0.25, "version": defaults.VERSION}) + "\n"
    measured: list[str] = []

    def alone(adapter, task, target, work_dir, records) -> float:
        measured.append(task.key)
        (work_dir / defaults.DEFAULTS_FILE).write_text(beside)  # the other tune ends first
        return 0.5

    monkeypatch.setattr(defaults, "_alone", alone)
    defaults.measure_defaults(adapter, tasks, target, tmp_path)
    assert (tmp_path / defaults.DEFAULTS_FILE).read_text() == beside and len(measured) == 1
    defaults.measure_defaults(adapter, tasks, target, tmp_path)
    assert len(measured) == 1


@pytest.mark.parametrize(
    "line",
    ['{"task": "ab12", "seconds": -1}', '{"task": "../x", "seconds": 1}',
     '{"task": "ab12", "seconds": 1, "code": "x"}', '{"task": "ab12", "seconds": NaN}',
     '["ab12", 1]', '{"task": "ab12", "seconds": true}',
     '{"task": "ab12", "seconds": 1, "version": 99}', '{"task": "ab12", "seconds": 1, "version": "3"}',
     '{"task": "ab12", "seconds": 1, "version": null}', '{"task": "ab12", "seconds": 1, "version": 1}',
     '{"task": "ab12", "best": 1, "seconds": 1}', '{"task": "ab12", "best": 0, "seconds": 1, "version": 3}',
     '{"task": "ab12", "best": "1", "seconds": 1, "version": 3}', '{"task": 1, "seconds": 1}',
     '{"seconds": 1}'],
)  # fmt: skip
def test_a_default_latency_is_a_key_and_seconds_or_a_damaged_record(line, tmp_path) -> None:
    from relay_tasks.errors import ModelError
    from relay_tasks.tuning.defaults import DEFAULTS_FILE, VERSION, read_defaults

    (tmp_path / DEFAULTS_FILE).write_text(line + '\n{"task": "cd34", "seconds": 0.5}\n')
    with pytest.raises(ModelError, match=r"defaults.jsonl, line 1: not a record"):
        read_defaults(tmp_path)
    (tmp_path / DEFAULTS_FILE).write_text(
        f'{{"task": "cd34", "seconds": 0.5, "version": {VERSION}}}\n'
    )
    assert read_defaults(tmp_path) == {"cd34": 0.5}


@pytest.mark.parametrize("version", [{}, {"version": 2}, {"version": 3}, {"version": 4}])
def test_a_default_an_older_relay_tasks_measured_stands_in_until_tune_measures_it_again(
    version: dict[str, int], tuned: dict[str, Path], tiny, tmp_path
) -> None:
    """A line without a version (measured with the naive schedule, or the weights as inputs)
    or of version 2 (AutoTVM's dense weights as inputs), and a record timed alike then:
    compile uses the default and says so, times the record again; the next measurement
    replaces the default."""
    import json
    import shutil

    from relay_tasks.tuning.defaults import (
        DEFAULTS_FILE,
        measure_defaults,
        read_defaults,
        record_seconds,
        stale_defaults,
    )  # fmt: skip

    mod, params = load_model(tiny[0], params=tiny[1])
    work = tmp_path / "work"
    shutil.copytree(tuned["meta_schedule"], work)
    chosen = building.plan(mod, params, work)
    (key,) = {t.alternatives_of for t in chosen.tasks}
    (task,) = chosen.tasks
    alike = {"task": task.key, "best": 1e-3, "seconds": 1e-9, "version": 2}
    lines = [{"task": key, "seconds": 1e-9, **version}, *([alike] if version else [])]
    (work / DEFAULTS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert read_defaults(work) == {key: 1e-9} and stale_defaults(work) == {key}
    assert record_seconds(chosen.adapter, task, chosen.target, work, 1e-3) != 1e-9
    chosen = building.plan(mod, params, work)
    assert chosen.stale == chosen.tasks == chosen.slower
    assert "1 default latencies were measured by an older relay-tasks" in chosen.describe()
    measure_defaults(chosen.adapter, chosen.tasks, chosen.target, work)
    assert 0 < read_defaults(work)[key] < 1 and stale_defaults(work) == set()
    assert building.plan(mod, params, work).stale == []


def test_compile_names_the_tasks_without_records(tuned: dict[str, Path], tmp_path, capsys):
    """A model with a task the work dir never tuned: it is named before the build."""
    data = relay.var("data", shape=(1, 32))
    weight, other = relay.var("w", shape=(16, 32)), relay.var("v", shape=(8, 16))
    body = relay.nn.dense(relay.nn.relu(relay.nn.dense(data, weight)), other)
    text = tmp_path / "two.relay"
    text.write_text(tvm.IRModule.from_expr(relay.Function([data, weight, other], body)).astext())
    library = tmp_path / "two.tar"
    argv = ["compile", str(text), "--work-dir", str(tuned["meta_schedule"]), "-o", str(library)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "the records cover 1 of the model's 2 tasks; not tuned (built with default " in err
    assert "fused_nn_dense" in err.split("not tuned")[1]
    assert library.stat().st_size > 0


def test_benchmark_through_a_tracker(tuned: dict[str, Path], tiny, tmp_path, capsys) -> None:
    """The library goes to the device behind the tracker (here relay-tasks' server on this
    machine), runs there, and both latencies come back."""
    from relay_tasks.rpc import start_server, start_tracker

    text, params = tiny
    tracker = start_tracker()
    server = start_server(("127.0.0.1", tracker.port), "bench-device", port=9600)
    try:
        argv = ["compile", str(text), "--params", str(params), "--work-dir",
                str(tuned["autotvm"]), "-o", str(tmp_path / "m.so"), "--benchmark",
                "--rpc-tracker", f"127.0.0.1:{tracker.port}", "--rpc-key", "bench-device"]  # fmt: skip
        assert main(argv) == 0
    finally:
        server.terminate()
        tracker.terminate()
    assert re.fullmatch(BENCHMARK_LINE, capsys.readouterr().out.splitlines()[1])


def test_random_inputs_of_an_untyped_module() -> None:
    """Frontends (PyTorch's) return modules type inference has not run on."""
    data = relay.var("data", shape=(2, 8), dtype="float32")
    ids = relay.var("ids", shape=(2,), dtype="int64")
    weight = relay.var("w", shape=(4, 8))
    body = relay.Tuple([relay.nn.dense(data, weight), ids])
    mod = tvm.IRModule.from_expr(relay.Function([data, ids, weight], body))
    inputs = building.random_inputs(mod, {"w": np.zeros((4, 8), "float32")})
    assert {name: (v.shape, str(v.dtype)) for name, v in inputs.items()} == {
        "data": ((2, 8), "float32"),
        "ids": ((2,), "int64"),
    }


@pytest.mark.parametrize(
    ("tuned", "untuned", "said"),
    [
        ([1.0, 1.1, 1.2, 1.3], [2.0, 2.1, 2.2, 2.3], "tuned is 1.87x faster"),
        ([2.0, 2.1, 2.2, 2.3], [1.0, 1.1, 1.2, 1.3], "tuned is 1.87x slower"),
        ([1.0, 1.5, 2.0, 2.5], [1.4, 1.6, 1.8, 2.0], "no difference beyond the spread"),
    ],
)
def test_the_benchmark_says_which_is_faster_only_beyond_the_spread(tuned, untuned, said) -> None:
    outputs = [np.zeros(2, "float32")]
    line = building.summary(building.Run(tuned, outputs), building.Run(untuned, outputs))
    assert said in line
    assert line.startswith(f"tuned {np.median(tuned) * 1e3:.4g} ms (middle half ")


@pytest.mark.parametrize("faster", ["tuned", "untuned"])
def test_benchmark_writes_the_untuned_build_where_it_is_faster(
    faster: str, tuned: dict[str, Path], tiny, tmp_path, monkeypatch, capsys
) -> None:
    """Each record beat its default alone, and yet the model can run slower with them (on
    MobileNetV2, 5.57 ms tuned against 4.98): what --benchmark times, it writes the faster of."""
    written, untuned = [], []
    export, build_untuned = building.export, building.build_untuned

    def exporting(factory, output):
        written.append(factory)
        return export(factory, output)

    def untuned_build(*args):
        untuned.append(build_untuned(*args))
        return untuned[-1]

    def timed(factories, inputs, **options):
        fast, slow = [0.001] * 20, [0.002] * 20
        runs = (fast, slow) if faster == "tuned" else (slow, fast)
        return [building.Run(times, [np.zeros(1, "float32")]) for times in runs]

    monkeypatch.setattr(building, "export", exporting)
    monkeypatch.setattr(building, "build_untuned", untuned_build)
    monkeypatch.setattr(building, "compare", timed)
    text, params = tiny
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(tuned["autotvm"]),
            "-o", str(tmp_path / "m.so"), "--benchmark"]  # fmt: skip
    assert main(argv) == 0
    assert written[-1] is (untuned[0] if faster == "untuned" else written[0])
    assert len(written) == (2 if faster == "untuned" else 1)
    said = capsys.readouterr().err
    assert ("wrote the untuned build to " + str(tmp_path / "m.so")) in said or faster == "tuned"
    assert "untuned build" not in said or faster == "untuned"


def test_builds_compared_are_timed_in_turn_round_after_round(monkeypatch) -> None:
    """The host's speed drifts within a minute: two builds timed one after the other carry the
    drift as a difference, so a comparison times each in turn, in rounds, every repeat kept."""
    timed: list[str] = []

    class Graph:
        def __init__(self, name: str) -> None:
            self.name = name

        def benchmark(self, device, *, number, repeat, min_repeat_ms, end_to_end):
            timed.extend([self.name] * repeat)
            return type("Timing", (), {"results": [float(len(timed))] * repeat})()

        def run(self) -> None:
            pass

        def get_num_outputs(self) -> int:
            return 0

    monkeypatch.setattr(building, "_graph", lambda factory, *args: (Graph(factory), None))
    tuned, untuned = building.compare(["tuned", "untuned"], {}, repeat=20)
    assert len(tuned.repeats) == len(untuned.repeats) == 20
    rounds = building.ROUNDS
    assert rounds > 1
    assert timed == (["tuned"] * (20 // rounds) + ["untuned"] * (20 // rounds)) * rounds


@pytest.mark.parametrize("tuner", TUNERS)
def test_a_work_dir_this_user_cannot_write_still_compiles(
    tuner, tiny, tuned, tmp_path, monkeypatch, capsys
) -> None:
    """Records shipped to another machine, or a read-only mount: reading needs no exclusive
    lock (``compile`` exited 7, "cannot lock ro/.lock: Read-only file system"). The lock file
    cannot be made there, as on a read-only mount (tests run as root, whom modes do not stop)."""
    import errno
    import os
    import shutil

    from relay_tasks.adapters import journal

    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    (work / journal.LOCK_FILE).unlink(missing_ok=True)
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).endswith(journal.LOCK_FILE) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(journal.os, "open", read_only)
    text, params = tiny
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(tmp_path / "m.tar")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "m.tar").stat().st_size > 0
    assert main(["status", "--work-dir", str(work)]) == 0


def test_records_of_another_model_only_are_an_error_naming_what_was_tuned(
    tiny, tuned, tmp_path, capsys
) -> None:
    """``compile tiny.onnx --work-dir <a ResNet-18's>`` built an untuned library and exited 0;
    now it names what the work dir was tuned for, and ``--untuned`` builds on purpose."""
    from tuned_models import write_other

    text, params = write_other(tmp_path)
    tuned_text = tiny[0]
    work = tuned["autotvm"]
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(tmp_path / "m.tar")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert re.search(rf"the records in {work} cover none of {text}'s \d+ tasks \(it was tuned "
                     rf"for {re.escape(str(tuned_text))}: autotvm, 'llvm ", err), err  # fmt: skip
    assert "or pass --untuned to build it with TVM's default schedules" in err
    assert not (tmp_path / "m.tar").exists()
    assert main([*argv, "--untuned"]) == 0
    assert (tmp_path / "m.tar").stat().st_size > 0


def test_tvms_warnings_of_functions_without_records_are_one_line(tuned, tmp_path, capsys) -> None:
    """TVM printed "Cannot find workload: ..." twice per function without a record; the plan
    already names those tasks, so one line says it, and TVM's own lines go to tune.log."""
    import shutil

    from tuned_models import write_other

    work = tmp_path / "work"
    shutil.copytree(tuned["meta_schedule"], work)
    text, params = write_other(tmp_path)
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(tmp_path / "m.tar"), "--untuned"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "Cannot find workload" not in err, err
    assert err.splitlines()[1:] == [
        f"relay-tasks: built 1 function(s) without a record, as said above (TVM's messages: "
        f"{work / 'tune.log'})"
    ]
    assert "Cannot find workload: " in (work / "tune.log").read_text()


def _tiny_onnx(path: Path) -> Path:
    """The tiny model (dense 1x32 by 16x32, relu) as an ONNX file, its weight an initializer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tuned_models import tiny_weight

    graph = helper.make_graph(
        [helper.make_node("Gemm", ["data", "w"], ["y"], transB=1),
         helper.make_node("Relu", ["y"], ["out"])],
        "tiny",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(tiny_weight(), "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_benchmark_versus_onnxruntime_in_the_same_rounds(tuned, tmp_path, capsys) -> None:
    """ONNX Runtime's latency beside the tuned and untuned ones, timed in the same rounds, on
    the same inputs, its outputs compared with the tuned build's."""
    import onnxruntime

    model = _tiny_onnx(tmp_path / "tiny.onnx")
    argv = ["compile", str(model), "--work-dir", str(tuned["autotvm"]), "-o",
            str(tmp_path / "m.so"), "--benchmark", "--versus", "onnxruntime"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("2/2 tasks tuned, library in " + str(tmp_path / "m.so"))
    assert re.fullmatch(BENCHMARK_LINE, lines[1])
    versus = rf"onnxruntime {re.escape(onnxruntime.__version__)} {_TIMING}: ({_VERDICT})"
    found = re.fullmatch(versus + r"; outputs differ by at most ([0-9.e-]+)", lines[2])
    assert found and float(found.group(found.lastindex or 0)) < 1e-4, lines[2]


def test_versus_is_refused_where_it_cannot_compare(tuned, tiny, tmp_path, capsys) -> None:
    text, params = tiny
    base = ["compile", str(text), "--params", str(params), "--work-dir", str(tuned["autotvm"]),
            "-o", str(tmp_path / "m.so")]  # fmt: skip
    assert main([*base, "--versus", "onnxruntime"]) == 2
    assert capsys.readouterr().err == "relay-tasks: error: --versus applies to --benchmark only\n"
    assert main([*base, "--benchmark", "--versus", "onnxruntime"]) == 2
    assert capsys.readouterr().err == (
        f"relay-tasks: error: --versus onnxruntime needs an ONNX model file; {text} is not one "
        "(export the model to ONNX and compile that)\n"
    )
    assert not (tmp_path / "m.so").exists()


def test_onnxruntime_that_cannot_run_the_model_is_one_error(tmp_path) -> None:
    """ONNX Runtime reads the file in a confined child; its refusal comes back as one error."""
    from relay_tasks.errors import ModelError
    from relay_tasks.tuning.versus import OnnxRuntime

    path = tmp_path / "not.onnx"
    path.write_bytes(b"\x08\x07garbage")
    with pytest.raises(ModelError, match=rf"^ONNX Runtime cannot run {re.escape(str(path))}: "):
        OnnxRuntime(path, {}).time(1, 1)


def test_a_profile_gives_each_functions_calls_and_time_in_the_model() -> None:
    """A wide dense layer between two calls of one small one: the profile counts the calls the
    graph makes of each function, and puts the wide layer, with nearly all the work, first."""
    rng = np.random.default_rng(0)
    data = relay.var("data", shape=(64, 256))

    def dense(x: relay.Expr, units: int, width: int) -> relay.Expr:
        weight = relay.const(rng.standard_normal((units, width)).astype("float32"))
        return relay.nn.relu(relay.nn.dense(x, weight))

    small = dense(dense(data, 256, 256), 256, 256)  # one function, two calls
    wide = dense(small, 2048, 256)  # four times the FLOPs of both small calls
    mod = tvm.IRModule.from_expr(relay.Function([data], relay.sum(wide, axis=1)))
    factory = building.build_untuned(mod, {}, relay_tasks.host_target())
    calls = _graph_calls(factory)
    inputs = {"data": rng.standard_normal((64, 256)).astype("float32")}
    shares = building.profile(factory, inputs)
    assert {share.function: share.calls for share in shares} == calls
    assert sorted(calls.values()) == [1, 1, 2]  # the small layer's function twice, then sum
    assert all(share.seconds > 0 for share in shares)
    assert [share.seconds for share in shares] == sorted((s.seconds for s in shares), reverse=True)
    assert shares[0].calls == 1 and "dense" in shares[0].function
    table = building.format_profile(shares).splitlines()
    assert len(table) == len(shares) + 2
    assert table[1].split()[2] == "1" and table[1].split()[-1] == shares[0].function
    two = next(line.split() for line in table if line.split()[2] == "2")  # the small layer
    assert float(two[3]) == pytest.approx(float(two[0]) / 2, rel=2e-3)  # a call's time
    assert "the calls add up to" in table[-1] and "the model ran" not in table[-1]


def _graph_calls(factory) -> dict[str, int]:
    """The calls the library's graph makes of each function, by name as the profile gives it."""
    calls: dict[str, int] = {}
    for node in json.loads(factory.get_graph_json())["nodes"]:
        if node["op"] == "tvm_op":
            name = node["attrs"]["func_name"].removeprefix("tvmgen_default_")
            calls[name] = calls.get(name, 0) + 1
    return calls


def test_a_metaschedule_build_names_the_task_of_each_function(tuned, tiny) -> None:
    """TVM looks each function up in MetaSchedule's database by its name in the library: the
    build keeps whose record each function was built with, and that record's time; a function
    built with TVM's default schedule is not among them."""
    import dataclasses

    work = tuned["meta_schedule"]
    mod, params = load_model(tiny[0], params=tiny[1])
    chosen = building.plan(mod, params, work)
    (task,) = chosen.tasks
    with_record = dataclasses.replace(chosen, slower=[])
    built = building.build(mod, params, work, with_record)
    names = set(_graph_calls(built.factory))
    assert len(names) == 1 and built.functions == {name: task.key for name in names}
    assert built.records(with_record) == {name: with_record.best[task.key] for name in names}
    assert with_record.best[task.key] == min(
        s for _, s in raw_measurements(work, "meta_schedule") if s is not None
    )
    default = dataclasses.replace(chosen, slower=[task])
    assert building.build(mod, params, work, default).functions == {}


def test_a_profile_puts_each_record_beside_its_calls_in_the_model() -> None:
    shares = [building.Share("fused_nn_dense", 2, 0.004), building.Share("fused_add", 1, 0.001)]
    table = building.format_profile(shares, records={"fused_nn_dense": 0.0015}).splitlines()
    assert table[0].split() == ["ms", "in", "model", "share", "calls", "ms", "a", "call",
                                "record", "ms", "x", "record", "function"]  # fmt: skip
    assert table[1].split() == ["4", "80.0%", "2", "2", "1.5", "1.33", "fused_nn_dense"]
    assert table[2].split() == ["1", "20.0%", "1", "1", "-", "-", "fused_add"]
    assert table[-1] == (
        "  the 2 calls built with records ran 4 ms, 1.33x what their records add up to (3 ms, "
        "each timed alone with its data in cache)"
    )
