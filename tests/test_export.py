"""Task files: round trips, identical bytes, and files from elsewhere read as data only."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import tvm
from hypothesis import strategies as st
from tvm import relay, te

import relay_tasks
from relay_tasks.api import extract_models
from relay_tasks.cli import main
from relay_tasks.export import TaskFile, dumps, load_tasks, tasks_document

from checks import assert_task_file_round_trips
from zoo import CUDA, HOST, X86, load, model_target_rows

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
    """The document with its checksum recomputed, as docs/security.md defines it (an editor's tool
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


@pytest.mark.parametrize(("model", "target"), model_target_rows())
def test_every_zoo_model_round_trips(model: str, target: str) -> None:
    assert_task_file_round_trips(*load(model), target)


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
    document["tasks"][0]["payload"]["function"][0][1] = script
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
def test_a_function_that_is_not_its_keys_task_is_refused(tuner: str, tmp_path: Path) -> None:
    mod, params = load("conv_bias_bn_relu")
    tasks = relay_tasks.extract(mod, X86, params, tuner=tuner)
    other = dataclasses.replace(tasks[1], native=tasks[0].native, source=tasks[0].source)
    document = tasks_document(
        [tasks[0], other, *tasks[2:]], tuner=tuner, target=tvm.target.Target(X86), models=[]
    )
    with pytest.raises(
        relay_tasks.ModelError, match=r"task 1 \(.*\): its function is not the task its key names"
    ):
        load_tasks(_file(tmp_path, document))


#: LLVM IR whose constructor runs a command when the library holding it is loaded: what a
#: ``pragma_import_llvm`` annotation in a format-2 task file's TIR made tuning link and load.
_CONSTRUCTOR = """
@cmd = private constant [12 x i8] c"touch pwned\\00"
declare i32 @system(ptr)
define void @ctor_pwned() {
  %r = call i32 @system(ptr @cmd)
  ret void
}
@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] [{ i32, ptr, ptr } { i32 65535, ptr @ctor_pwned, ptr null }]
"""


def _imports_llvm() -> tvm.IRModule:
    """A TIR module whose block annotation asks the CPU code generator to link ``_CONSTRUCTOR``
    (no call by name anywhere: format 2's check for those let it through)."""
    data = te.placeholder((4,), name="A")
    out = te.compute((4,), lambda i: data[i] + 1.0, name="B")
    func = te.create_prim_func([data, out]).with_attr("global_symbol", "main")
    sch = tvm.tir.Schedule(func)
    (loop,) = sch.get_loops(sch.get_block("B"))
    sch.annotate(loop, "pragma_import_llvm", _CONSTRUCTOR)
    return sch.mod


def test_a_compiled_form_in_a_task_file_is_never_compiled(
    task_texts: dict[str, str], tmp_path: Path, monkeypatch, capsys
) -> None:
    """Issue 26: format 2 carried each task's TIR, and TIR can hold LLVM IR that codegen links.
    Neither an old file nor a current one with that TIR added beside its function is read."""
    monkeypatch.chdir(tmp_path)
    evil = _imports_llvm()
    func = evil["main"]
    parts = [func.params, [func.buffer_map[p] for p in func.params], func.body, None, func.attrs]
    document = json.loads(task_texts["meta_schedule"])
    # Format 2's encoding of a TIR module: each function's parts in TVM's object JSON.
    document["tasks"][0]["payload"]["dispatched"] = [[["main", tvm.ir.save_json(parts)]]]
    for form in ("relay-tasks/2", "relay-tasks/3"):
        path = _file(tmp_path, _sealed({**document, "format": form}))
        work = tmp_path / f"w{form[-1]}"
        assert main(["tune", str(path), "--trials", "1", "--work-dir", str(work)]) == 3
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1
        assert "format relay-tasks/2" in err if form.endswith("2") else "'dispatched'" in err
        assert not (tmp_path / "pwned").exists()
    # The annotation is live: the code generator links the file's constructor into the library.
    assert "ptr @ctor_pwned" in tvm.build(evil, target=HOST).get_source("ll")


def _relu_chain(length: int) -> list[Any]:
    """A function table of ``length`` nested relus: a file's way to ask for deep recursion."""
    var = ["var", "p0", ["tensor", [["int", "int32", 4]], "float32"]]
    calls = [["call", "nn.relu", [i], None] for i in range(length)]
    return [var, *calls, ["function", [0], length, {"Primitive": 1}]]


def _set(where: Callable[[list[Any]], Any], value: Any) -> Callable[[list[Any]], None]:
    def change(function: list[Any]) -> None:
        container, key = where(function)
        container[key] = value

    return change


#: What a file could put in a task's function, and the refusal each gets (before anything is
#: lowered: no key matches any of them).
FUNCTION_ATTACKS = {
    "an external compiler's function": (
        lambda f: f[-1][3].update(Compiler="ccompiler", global_symbol="f();system(0)"),
        "function attributes ['Compiler', 'Primitive', 'global_symbol'] are not FuseOps' flags",
    ),
    "a callback in an operator's attributes": (
        _set(lambda f: (f, 1), ["call", "nn.relu", [0], ["relay.attrs.DebugAttrs", {}]]),
        "nn.relu takes attributes of type none, not 'relay.attrs.DebugAttrs'",
    ),
    "a TIR operator": (
        _set(lambda f: (f, 1), ["call", "tir.call_extern", [0], None]),
        "'tir.call_extern' is not a Relay operator lowering computes",
    ),
    "a debugging operator": (
        _set(lambda f: (f, 1), ["call", "debug", [0], None]),
        "'debug' is not a Relay operator lowering computes",
    ),
    "another operator's attributes": (
        _set(lambda f: (f, 1), ["call", "nn.relu", [0], ["relay.attrs.Conv2DAttrs", {}]]),
        "nn.relu takes attributes of type none, not 'relay.attrs.Conv2DAttrs'",
    ),
    "a name that is code": (
        _set(lambda f: (f[0], 1), 'p0"); system("touch pwned'),
        "is not a name (letters, digits, _ and .)",
    ),
    "a dimension of 2**40": (
        _set(lambda f: (f[0][2][1], 0), ["int", "int64", 2**40]),
        "is not an integer from 0 to 16777216",
    ),
    "a dimension a tuner would tile 537,600 ways": (
        _set(lambda f: (f[0], 2), ["tensor", [["int", "int64", 14_414_400]], "float32"]),
        "its dimension 14414400 has 537,600 tilings, more than the 100,000 any real model's has",
    ),
    "100,000 nodes": (
        lambda f: f.__setitem__(slice(None), _relu_chain(100_000)),
        "the function has 100002 nodes (at most 20000)",
    ),
    "nesting 5,000 deep": (
        lambda f: f.__setitem__(slice(None), _relu_chain(5_000)),
        "the function nests deeper than 1024 nodes",
    ),
    "a call that crashes TVM's type relation": (
        _set(lambda f: (f, 1), ["call", "nn.dilate", [0], None]),
        "its function crashes TVM when lowered (SIGSEGV): no extraction writes such a function",
    ),
    "a cycle": (
        _set(lambda f: (f, 1), ["call", "nn.relu", [1], None]),
        "node 1 refers to 1, which is not an earlier node",
    ),
}


@pytest.mark.parametrize("attack", FUNCTION_ATTACKS)
@pytest.mark.parametrize("tuner", TUNERS)
def test_a_function_outside_the_allowlist_is_refused_before_anything_is_lowered(
    attack: str, tuner: str, task_texts, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Issue 26: a task file's function is read from an allowlist (registered operators with
    their own attributes types, plain values, identifiers, bounded sizes), checksum valid."""
    monkeypatch.chdir(tmp_path)
    change, message = FUNCTION_ATTACKS[attack]
    document = json.loads(task_texts[tuner])
    function = document["tasks"][0]["payload"]["function"]
    # Every tuner's first task cut to one simple call of its first parameter.
    function[1:-1] = [["call", "nn.relu", [0], None]]
    function[-1][1:3] = [[0], 1]
    change(function)
    path = _file(tmp_path, _sealed(document))
    with pytest.raises(relay_tasks.ModelError) as caught:
        load_tasks(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{path}: task 0 (")
    assert main(["tune", str(path), "--trials", "1", "--work-dir", str(tmp_path / "w")]) == 3
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "w").exists()


def test_constant_names_round_trip_into_each_tuners_keys(tmp_path: Path) -> None:
    """Linked tensor constants are named from a supply the whole model shared, and the names
    enter Ansor's workload keys: the file records them and lowering here uses them."""
    from relay_graphs import linked_repeats

    for tuner in TUNERS:
        tasks = relay_tasks.extract(linked_repeats(), X86, tuner=tuner)
        with_constants = [t for t in tasks if t.source and t.source.lowered.constants]
        assert with_constants, tuner
        document = tasks_document(tasks, tuner=tuner, target=tvm.target.Target(X86), models=[])
        loaded = load_tasks(_file(tmp_path, document))
        assert [t.key for t in loaded.tasks] == [t.key for t in tasks], tuner
        names = lambda t: [c.op.name for c, _ in t.source.lowered.constants]  # noqa: E731
        assert [names(t) for t in loaded.tasks] == [names(t) for t in tasks]


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
        'not a relay-tasks task file (no "format": "relay-tasks/3"); re-extract it with '
        "relay-tasks extract --format json",
    ),
    "future format": (
        _damaged(lambda d: d.update(format="relay-tasks/9")),
        "unknown task file format 'relay-tasks/9' (this relay-tasks reads relay-tasks/3); "
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


def test_unreadable_and_too_deep_files_are_named(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(relay_tasks.ModelError, match=r"missing.json: cannot read the task file \("):
        load_tasks(tmp_path / "missing.json")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")  # no writer: reading it would wait for ever
    for name in ("folder", "fifo"):
        with pytest.raises(relay_tasks.ModelError, match=f"{name}: not a regular file; give "):
            load_tasks(tmp_path / name)
    monkeypatch.setattr(importlib.import_module("relay_tasks.export"), "MAX_FILE_BYTES", 1000)
    large = tmp_path / "large.json"
    large.write_text(" " * 1001)  # refused before its text is parsed
    with pytest.raises(
        relay_tasks.ModelError, match="large.json: larger than 1,000 bytes, which no task "
    ):
        load_tasks(large)
    monkeypatch.undo()
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


def test_the_formats_page_shows_what_extract_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/formats.md quotes a model, a command and its output: the command, run on that
    model, prints that output byte for byte."""
    import re
    import shlex

    page = (Path(__file__).resolve().parent.parent / "docs" / "formats.md").read_text()
    model, command, output = re.findall(r"^```[a-z]*\n(.*?)^```$", page, re.M | re.S)[:3]
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:3] == ["./dev", "relay-tasks", "extract"]
    (tmp_path / argv[3]).write_text(model)
    monkeypatch.chdir(tmp_path)
    assert main(argv[2:]) == 0
    assert capsys.readouterr().out == output


def test_task_files_are_indented_with_sorted_keys(task_texts) -> None:
    """Two extractions diff line by line: two-space indents, keys in sorted order."""
    text = dumps(json.loads(task_texts["meta_schedule"]))
    lines = text.splitlines()
    assert lines[0] == "{" and lines[1].startswith('  "') and not lines[1].startswith("   ")
    keys: list[list[str]] = []
    json.loads(text, object_pairs_hook=lambda pairs: keys.append([k for k, _ in pairs]) or {})
    assert all(k == sorted(k) for k in keys) and any(len(k) > 1 for k in keys)


def test_a_lowering_that_never_ends_or_crashes_is_named_with_its_task(monkeypatch) -> None:
    """The forked derivation reports the task it works on: a child that stops answering is
    killed after ``LOWERING_SECONDS`` and a crash is named by its signal, each with the task."""
    import signal
    import time

    from relay_tasks import export

    def hangs_at_2(report: Callable[[int], None]) -> None:
        for index in range(3):
            report(index)
        time.sleep(60)

    def crashes_at_1(report: Callable[[int], None]) -> None:
        report(0)
        report(1)
        os.kill(os.getpid(), signal.SIGSEGV)

    monkeypatch.setattr(export, "LOWERING_SECONDS", 0.5)
    started = time.monotonic()
    assert export._crash_in_a_child(hangs_at_2) == (2, "takes TVM more than 0.5 s to lower")
    assert time.monotonic() - started < 10
    assert export._crash_in_a_child(crashes_at_1) == (1, "crashes TVM when lowered (SIGSEGV)")
    assert export._crash_in_a_child(lambda report: report(0)) is None
