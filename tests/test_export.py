"""Task files: round trips, identical bytes, and files from elsewhere read as data only."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import tvm
from hypothesis import strategies as st
from tvm import auto_scheduler, relay, te
from tvm import meta_schedule as ms

import relay_tasks
from relay_tasks.adapters import get_adapter
from relay_tasks.api import extract_models
from relay_tasks.cli import main
from relay_tasks.export import TaskFile, dumps, load_tasks, tasks_document

from zoo import CUDA, X86, load

TUNERS = ("meta_schedule", "autotvm", "ansor")


class _Texts(dict):  # type: ignore[type-arg]
    def __repr__(self) -> str:  # hypothesis prints its arguments; these are 1 MB
        return "task_texts"


@pytest.fixture(scope="module")
def task_texts() -> dict[str, str]:
    """Each tuner's task file of a small model, as ``extract --format json`` writes it."""
    mod, params = load("conv_bias_bn_relu")
    texts = _Texts()
    for tuner in TUNERS:
        tasks = relay_tasks.extract(mod, X86, params, tuner=tuner)
        assert len(tasks) >= 2, "the fuzz swaps tasks: it needs two"
        document = tasks_document(tasks, tuner=tuner, target=tvm.target.Target(X86), models=["m"])
        texts[tuner] = dumps(document)
    return texts


def _sealed(document: dict[str, Any]) -> dict[str, Any]:
    """The document with its checksum recomputed, as the README defines it (an editor's tool
    could do the same): sha256 of the compact, key-sorted JSON of everything else."""
    content = {name: value for name, value in document.items() if name != "sha256"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return {**content, "sha256": hashlib.sha256(canonical.encode()).hexdigest()}


def _file(folder: Path, document: dict[str, Any] | str) -> Path:
    path = folder / "tasks.json"
    path.write_text(document if isinstance(document, str) else dumps(document))
    return path


@pytest.mark.parametrize("tuner", ["meta_schedule", "autotvm", "ansor"])
@pytest.mark.parametrize("target", [X86, CUDA])
def test_task_files_round_trip(tuner: str, target: str, tmp_path: Path) -> None:
    mod, params = load("conv_bias_bn_relu")
    # Two models with tasks of their own and shared ones, so per-task models differ.
    other, other_params = load("depthwise_conv")
    tasks = extract_models([("m", mod, params), ("n", other, other_params)], target, tuner=tuner)
    assert len({t.models for t in tasks}) > 1
    document = tasks_document(
        tasks, tuner=tuner, target=tvm.target.Target(target), models=["m", "n"]
    )
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(document))
    loaded = load_tasks(path)
    assert (loaded.tuner, str(loaded.target), loaded.models) == (
        tuner,
        str(tvm.target.Target(target)),
        ("m", "n"),
    )
    fields = lambda t: (t.name, t.weight, t.anchor_op, t.key, t.models, t.group)  # noqa: E731
    assert [fields(t) for t in loaded.tasks] == [fields(t) for t in tasks]
    for ours, back in zip(tasks, loaded.tasks, strict=True):
        if tuner == "meta_schedule":
            assert tvm.ir.structural_equal(ours.native.dispatched[0], back.native.dispatched[0])
            assert tvm.ir.structural_equal(ours.native.mod, back.native.mod)
        elif tuner == "autotvm":
            assert (ours.native.name, ours.native.args) == (back.native.name, back.native.args)
            assert len(back.native.config_space) == len(ours.native.config_space)
        else:
            assert back.native.workload_key == ours.native.workload_key
            assert str(back.native.compute_dag) == str(ours.native.compute_dag)


@pytest.mark.parametrize(
    "content",
    [
        "{",
        '{"format": "other"}',
        '{"format": "relay-tasks/1", "tuner": "autotvm", "target": "llvm", "tasks": [{"name": "x"}]}',
    ],
)
def test_bad_task_files(content: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    path.write_text(content)
    with pytest.raises(relay_tasks.ModelError, match="tasks.json: "):
        load_tasks(path)


def test_json_output_is_identical_across_processes(tmp_path: Path) -> None:
    text, params = tmp_path / "m.relay", tmp_path / "m.params"
    mod, weights = load("conv_bias_bn_relu")
    text.write_text(mod.astext())
    params.write_bytes(relay.save_param_dict(weights))
    outputs = []
    for seed in ("1", "2"):
        for tuner in ("meta_schedule", "autotvm", "ansor"):
            command = [
                sys.executable,
                "-m",
                "relay_tasks.cli",
                "extract",
                str(text),
                "--params",
                str(params),
                "--target",
                X86,
                "--tuner",
                tuner,
                "--format",
                "json",
            ]
            env = {**os.environ, "PYTHONHASHSEED": seed}
            outputs.append(subprocess.run(command, capture_output=True, env=env, check=True).stdout)
    assert outputs[:3] == outputs[3:]
    assert all(json.loads(o)["tasks"] for o in outputs)


def test_an_old_task_file_is_refused_and_its_code_never_runs(
    task_texts: dict[str, str], tmp_path: Path, monkeypatch, capsys
) -> None:
    """The file of issue 13: format 1 held TVMScript, and reading TVMScript runs Python."""
    monkeypatch.chdir(tmp_path)
    command = '__import__("os").system("touch pwned")'
    script = (
        "# from tvm.script import tir as T\n\n@T.prim_func\n"
        f'def main(A: T.Buffer(({command} * 0 + 4,), "float32")):\n    T.evaluate(0)\n'
    )
    document = json.loads(task_texts["meta_schedule"])
    document["format"] = "relay-tasks/1"
    document["tasks"][0]["payload"]["dispatched"] = [script]
    path = _file(tmp_path, document)
    with pytest.raises(relay_tasks.ModelError, match="older relay-tasks .* re-extract it"):
        load_tasks(path)
    assert main(["tune", str(path), "--trials", "1", "--work-dir", str(tmp_path / "w")]) == 3
    assert len(capsys.readouterr().err.splitlines()) == 1
    # The same text inside a current file, checksum and key intact, is still only a string.
    document = json.loads(task_texts["meta_schedule"])
    document["tasks"][0]["payload"]["dispatched"] = [[["main", script]]]
    path = _file(tmp_path, _sealed(document))
    with pytest.raises(relay_tasks.ModelError, match=r"task 0 \(.*\): its payload cannot be read"):
        load_tasks(path)
    assert not (tmp_path / "pwned").exists()
    # The payload is live: a reader that parsed TVMScript would have run the command.
    tvm.script.from_source(script)
    assert (tmp_path / "pwned").exists()


def test_a_file_edited_after_extraction_is_refused(task_texts: dict[str, str], tmp_path) -> None:
    document = json.loads(task_texts["autotvm"])
    document["tasks"][1]["weight"] += 1
    with pytest.raises(relay_tasks.ModelError, match="tasks.json: changed since it was written"):
        load_tasks(_file(tmp_path, document))
    load_tasks(_file(tmp_path, _sealed(document)))  # a deliberate edit, resealed, is accepted


@pytest.mark.parametrize("tuner", TUNERS)
def test_a_payload_that_is_not_its_keys_task_is_refused(tuner: str, tmp_path: Path) -> None:
    mod, params = load("conv_bias_bn_relu")
    tasks = relay_tasks.extract(mod, X86, params, tuner=tuner)
    swapped = [tasks[0], dataclasses.replace(tasks[1], native=tasks[0].native), *tasks[2:]]
    document = tasks_document(swapped, tuner=tuner, target=tvm.target.Target(X86), models=[])
    with pytest.raises(
        relay_tasks.ModelError, match=r"task 1 \(.*\): its payload is not the task its key names"
    ):
        load_tasks(_file(tmp_path, document))


def _calls_system() -> tuple[te.Tensor, te.Tensor]:
    data = te.placeholder((4,), name="A")
    call = tvm.tir.call_extern("float32", "system", "touch pwned")
    return data, te.compute((4,), lambda i: data[i] + call, name="B")


def _smuggled(text: str, tuner: str, native: Any) -> dict[str, Any]:
    """A real task file whose first task is replaced by ``native``, keys and checksum redone,
    as a tool (or an attacker) that knows the format would write it."""
    document = json.loads(text)
    adapter = get_adapter(tuner)
    entry = document["tasks"][0]
    entry["payload"], entry["key"] = adapter.encode(native), adapter.key(native)
    return _sealed(document)


def test_tir_that_calls_out_by_name_is_refused(task_texts: dict[str, str], tmp_path) -> None:
    """Tuning compiles and runs a task: a file must not be able to pick native code to call."""
    target = tvm.target.Target(X86)
    func = te.create_prim_func(list(_calls_system())).with_attr("global_symbol", "main")
    relay_mod = load_tasks(_file(tmp_path, task_texts["meta_schedule"])).tasks[0].native.mod
    evil = ms.ExtractedTask("evil", relay_mod, target, [tvm.IRModule({"main": func})], 1)
    document = _smuggled(task_texts["meta_schedule"], "meta_schedule", evil)
    with pytest.raises(relay_tasks.ModelError, match=r"calls functions by name \(tir.call_extern"):
        load_tasks(_file(tmp_path, document))


def test_ansor_compute_that_calls_out_by_name_is_refused(task_texts, tmp_path: Path) -> None:
    target = tvm.target.Target(X86)
    tensors = list(_calls_system())
    key = auto_scheduler.ComputeDAG(tensors).workload_key()
    auto_scheduler.workload_registry.register_workload_tensors(key, tensors)
    hardware = auto_scheduler.HardwareParams(num_cores=1, target=target)
    evil = auto_scheduler.SearchTask(workload_key=key, target=target, hardware_params=hardware)
    document = _smuggled(task_texts["ansor"], "ansor", evil)
    with pytest.raises(relay_tasks.ModelError, match=r"calls functions by name \(tir.call_extern"):
        load_tasks(_file(tmp_path, document))


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=1),
)


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document (the root excluded), containers before their contents."""
    found = [path] if path else []
    children = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for name, child in children:
        found += _paths(child, (*path, name))
    return found


def _at(document: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    """The container holding ``path`` and the key or index within it."""
    for step in path[:-1]:
        document = document[step]
    return document, path[-1]


def _mutate(text: str, data: st.DataObject) -> str:
    """One damage or edit a file could suffer in transit or by hand."""
    document = json.loads(text)
    how = data.draw(
        st.sampled_from(["truncate", "reformat", "drop", "replace", "char", "int", "swap"])
    )
    if how == "truncate":
        return text[: data.draw(st.integers(0, len(text) - 1))]
    if how == "reformat":  # the same JSON, spelled differently: must reload identically
        return json.dumps(document, indent=data.draw(st.sampled_from([None, 1, 4])))
    if how == "swap":
        first, second = data.draw(st.permutations(range(len(document["tasks"]))))[:2]
        tasks = document["tasks"]
        tasks[first], tasks[second] = tasks[second], tasks[first]
        return json.dumps(document)
    paths = _paths(document)
    if how in ("char", "int"):
        kind = str if how == "char" else int
        paths = [p for p in paths if type(_at(document, p)[0][_at(document, p)[1]]) is kind]
    container, key = _at(document, data.draw(st.sampled_from(paths)))
    if how == "drop":
        del container[key]
    elif how == "replace":
        container[key] = data.draw(JSON_VALUES)
    elif how == "int":
        container[key] += data.draw(st.sampled_from([-1, 1]))
    else:
        value = container[key]
        where = data.draw(st.integers(0, max(len(value) - 1, 0)))
        container[key] = value[:where] + data.draw(st.characters()) + value[where + 1 :]
    return json.dumps(document)


@pytest.mark.parametrize("tuner", TUNERS)
@hypothesis.settings(max_examples=150, deadline=None, database=None)
@hypothesis.given(data=st.data())
def test_a_damaged_task_file_reloads_identically_or_fails_with_one_model_error(
    tuner: str, data: st.DataObject, task_texts: dict[str, str]
) -> None:
    text = task_texts[tuner]
    mutated = _mutate(text, data)
    with tempfile.TemporaryDirectory() as folder:
        try:
            loaded = load_tasks(_file(Path(folder), mutated))
        except relay_tasks.ModelError as err:
            hypothesis.event(str(err).split(": ", 1)[1].split(" (")[0][:40])
            assert type(err) is relay_tasks.ModelError and "\n" not in str(err)
            return
        original = load_tasks(_file(Path(folder), text))
    hypothesis.event("reloaded")
    assert _same_task_files(loaded, original), "a changed file was accepted as other tasks"


def _same_task_files(a: TaskFile, b: TaskFile) -> bool:
    """Equal as tuning problems: fields, and each native task compared the way its tuner would.

    (Bytes are no test: a TIR annotation map comes back in another order, and is written so.)
    """
    fields = lambda f: (f.tuner, str(f.target), f.models)  # noqa: E731
    rows = lambda f: [(t.name, t.weight, t.anchor_op, t.key, t.models) for t in f.tasks]  # noqa: E731
    if (fields(a), rows(a)) != (fields(b), rows(b)):
        return False
    for x, y in zip(a.tasks, b.tasks, strict=True):
        if a.tuner == "meta_schedule":
            same = tvm.ir.structural_equal(x.native.mod, y.native.mod) and all(
                tvm.ir.structural_equal(p, q)
                for p, q in zip(x.native.dispatched, y.native.dispatched, strict=True)
            )
            same = same and (x.native.task_name, x.native.weight) == (
                y.native.task_name,
                y.native.weight,
            )
        elif a.tuner == "autotvm":
            same = (x.native.name, x.native.args) == (y.native.name, y.native.args)
        else:
            same = (x.native.workload_key, x.native.desc, str(x.native.compute_dag)) == (
                y.native.workload_key,
                y.native.desc,
                str(y.native.compute_dag),
            )
        if not same:
            return False
    return True


@pytest.mark.parametrize(
    "field", ["index", "name", "weight", "anchor_op", "gflop", "key", "models", "payload"]
)
def test_a_task_without_one_of_its_fields_is_refused(field: str, task_texts, tmp_path) -> None:
    document = json.loads(task_texts["autotvm"])
    del document["tasks"][1][field]
    with pytest.raises(relay_tasks.ModelError, match=f'task 1 has no "{field}"; re-extract it'):
        load_tasks(_file(tmp_path, _sealed(document)))


def _damaged(change: Any) -> Any:
    """A damage applied to the autotvm file's document (sealed again, so only it is wrong)."""

    def apply(document: dict[str, Any]) -> Any:
        result = change(document)
        return _sealed(document) if result is None else result

    return apply


DAMAGES = {
    "a list": (
        _damaged(lambda d: [d]),
        'not a relay-tasks task file (no "format": "relay-tasks/2"); re-extract it with '
        "relay-tasks extract --format json",
    ),
    "future format": (
        _damaged(lambda d: d.update(format="relay-tasks/9")),
        "unknown task file format 'relay-tasks/9' (this relay-tasks reads relay-tasks/2); "
        "re-extract it with relay-tasks extract --format json",
    ),
    "tuner not a string": (
        _damaged(lambda d: d.update(tuner=3)),
        'the file: "tuner" is not a string',
    ),
    "task not an object": (
        _damaged(lambda d: d["tasks"].__setitem__(0, "x")),
        "task 0 is not a JSON object",
    ),
    "moved": (
        _damaged(lambda d: d["tasks"][0].update(index=1)),
        "task 0 says it is task 1 (tasks were moved)",
    ),
    "weight 0": (
        _damaged(lambda d: d["tasks"][1].update(weight=0)),
        "task 1: weight 0 (a task is used at least once)",
    ),
    "unknown tuner": (
        _damaged(lambda d: d.update(tuner="tvm")),
        "unknown tuner 'tvm'",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_each_damage_is_named_exactly(damage: str, task_texts, tmp_path: Path) -> None:
    change, message = DAMAGES[damage]
    path = _file(tmp_path, change(json.loads(task_texts["autotvm"])))
    with pytest.raises(relay_tasks.ModelError) as caught:
        load_tasks(path)
    assert str(caught.value) == f"{path}: {message}"


def test_unreadable_and_too_deep_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(relay_tasks.ModelError, match=r"tasks.json: cannot read the task file \("):
        load_tasks((tmp_path / "tasks.json").mkdir() or tmp_path / "tasks.json")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(relay_tasks.ModelError) as caught:
        load_tasks(deep)
    assert str(caught.value) == f"{deep}: not a task file (JSON nested too deeply)"


def test_gflop_is_the_tasks_work_in_billions() -> None:
    """A lone unpadded convolution, counted by hand: 2 * N*K*OH*OW * C*R*S multiply-adds,
    written in billions with six decimals (451,584 -> 0.000452)."""
    data = relay.var("data", shape=(1, 8, 16, 16))
    weight = relay.var("weight", shape=(16, 8, 3, 3))
    mod = tvm.IRModule.from_expr(relay.nn.conv2d(data, weight, channels=16, kernel_size=(3, 3)))
    flops = 2 * 1 * 16 * 14 * 14 * 8 * 3 * 3
    for tuner in TUNERS:
        tasks = relay_tasks.extract(mod, X86, tuner=tuner)
        document = tasks_document(tasks, tuner=tuner, target=tvm.target.Target(X86), models=[])
        convs = [t["gflop"] for t in document["tasks"] if "conv2d" in t["name"]]
        assert convs == [0.000452], tuner
    assert round(flops / 1e9, 6) == 0.000452
    # And a large one, where the sixth decimal shows a unit off by one part in a billion,
    # a 1x1 convolution: 2 * 8*1024*112*112 * 1024 = 210,453,397,504 -> 210.453398 (a unit of
    # 1e9 + 1 would give 210.453397).
    data = relay.var("data", shape=(8, 1024, 112, 112))
    weight = relay.var("weight", shape=(1024, 1024, 1, 1))
    big = tvm.IRModule.from_expr(relay.nn.conv2d(data, weight, channels=1024, kernel_size=(1, 1)))
    tasks = relay_tasks.extract(big, X86, tuner="meta_schedule")
    document = tasks_document(
        tasks, tuner="meta_schedule", target=tvm.target.Target(X86), models=[]
    )
    assert [t["gflop"] for t in document["tasks"] if "conv2d" in t["name"]] == [210.453398]


def test_task_files_are_indented_with_sorted_keys(task_texts) -> None:
    """Two extractions diff line by line: two-space indents, keys in sorted order."""
    text = dumps(json.loads(task_texts["meta_schedule"]))
    lines = text.splitlines()
    assert lines[0] == "{" and lines[1].startswith('  "') and not lines[1].startswith("   ")
    keys: list[list[str]] = []
    json.loads(text, object_pairs_hook=lambda pairs: keys.append([k for k, _ in pairs]) or {})
    assert all(k == sorted(k) for k in keys) and any(len(k) > 1 for k in keys)
