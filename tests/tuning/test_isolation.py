"""Nothing placed in a work dir runs: the tuning processes import and unpickle nothing from it,
and write nothing outside it through a link or a task name."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relay_tasks.cli import main

from tuned_models import TUNERS, tune_argv, valid_count

LOGS = {"meta_schedule": "database_tuning_record.json", "autotvm": "autotvm.log",
        "ansor": "ansor.json"}  # fmt: skip


class _Planted:
    """Unpickling this writes the marker: what a crafted pickle cache entry would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def _plant(work: Path, marker: Path) -> None:
    """A module named as the package and a pickle cache with a crafted winograd entry."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "relay_tasks.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    cache = work / ".pkl_memoize_py3"
    cache.mkdir()
    for key in ("topi.nn.winograd_matrices", "topi.nn.winograd_util"):
        (cache / f"{key}.pkl").write_bytes(pickle.dumps({"x": _Planted(marker)}))


@pytest.mark.parametrize("tuner", ["autotvm"])
def test_nothing_in_the_work_dir_is_imported_or_unpickled_and_nothing_listens(
    tuner, tiny, tmp_path
) -> None:
    """AutoTVM starts builders and runners: none of them runs from the work dir, and local
    measurement opens no port another local user could connect to (AutoTVM's own local
    runner starts a tracker and a server on 127.0.0.1)."""
    work, marker = tmp_path / "work", tmp_path / "ran"
    _plant(work, marker)
    before = {p.name for p in (work / ".pkl_memoize_py3").iterdir()}
    command = [sys.executable, "-m", "relay_tasks.cli", *tune_argv(tiny, tuner, work, 2)]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    listening: set[int] = set()
    while child.poll() is None:
        listening |= _listening_ports(child.pid)
        time.sleep(0.1)
    assert child.returncode == 0, child.stderr.read().decode() if child.stderr else ""
    assert listening == set()
    assert valid_count(work, tuner) == 2
    assert not marker.exists()
    assert {p.name for p in (work / ".pkl_memoize_py3").iterdir()} == before  # none written


def _listening_ports(root: int) -> set[int]:
    """TCP ports that ``root`` or any process under it listens on (read from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree, grew = tree | more, bool(more)
    sockets = set()
    for pid in tree:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        sockets.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in sockets:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.parametrize("tuner", TUNERS)
def test_a_log_that_is_a_link_is_refused_not_followed(tuner, tiny, tuned, tmp_path, capsys):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere.txt"
    shutil.copytree(tuned[tuner], work)
    elsewhere.write_text("the user's file\n")
    log = work / LOGS[tuner]
    log.unlink()
    log.symlink_to(elsewhere)
    assert main(tune_argv(tiny, tuner, work, 5)) == 7
    err = capsys.readouterr().err
    assert f"{log} is a symbolic link; a work dir's records are written only inside it" in err
    assert elsewhere.read_text() == "the user's file\n"


def test_the_tune_log_is_not_followed_out_of_the_work_dir(tiny, tuned, tmp_path, capsys):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere.txt"
    shutil.copytree(tuned["ansor"], work)
    elsewhere.write_text("the user's file\n")
    (work / "tune.log").unlink()
    (work / "tune.log").symlink_to(elsewhere)
    assert main(tune_argv(tiny, "ansor", work, 5)) == 7
    assert "tune.log: it is a symbolic link" in capsys.readouterr().err
    assert elsewhere.read_text() == "the user's file\n"


#: Where a record names its target: AutoTVM's first input field, Ansor's task's second.
_RECORD_TARGETS = {
    "autotvm": lambda record: record["input"],
    "ansor": lambda record: record["i"][0],
}


@pytest.mark.parametrize("tuner", sorted(_RECORD_TARGETS))
def test_a_records_target_with_cl_opt_is_refused(tuner, tiny, tuned, tmp_path, capsys):
    """A record whose target carries ``-cl-opt`` (each tuner's record reader parses it with
    TVM's grammar) is damage, named with its file and line, before any tuner reads the log."""
    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    log = work / LOGS[tuner]
    record = json.loads(log.read_text().splitlines()[-1])
    fields = _RECORD_TARGETS[tuner](record)
    index = 0 if tuner == "autotvm" else 1
    fields[index] += " -cl-opt=-dot-cfg-dir:string=" + str(tmp_path)
    with log.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    assert main(["status", "--work-dir", str(work)]) == 3
    err = capsys.readouterr().err
    assert f"{log.name}, line" in err and "its target sets '-cl-opt'" in err, err
    assert main(tune_argv(tiny, tuner, work, 5)) == 3
    assert "its target sets '-cl-opt'" in capsys.readouterr().err


#: Every file a command reads from a work dir, by the tuner whose work dir holds it.
_READ_FILES = [
    ("meta_schedule", "database_workload.json"),
    ("meta_schedule", "database_tuning_record.json"),
    ("meta_schedule", "meta_schedule_times.jsonl"),
    ("autotvm", "autotvm.log"),
    ("ansor", "ansor.json"),
    ("ansor", "defaults.jsonl"),
    ("autotvm", "tasks.json"),
]


@pytest.mark.timeout(120)  # before the fix, each of these waited for a writer for ever
@pytest.mark.parametrize(("tuner", "name"), _READ_FILES)
def test_a_fifo_in_place_of_a_work_dir_file_is_refused_not_waited_on(
    tuner, name, tiny, tuned, tmp_path, capsys
):
    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    (work / name).unlink(missing_ok=True)
    os.mkfifo(work / name)
    for argv in (["status", "--work-dir", str(work)],
                 ["compile", str(tiny[0]), "--params", str(tiny[1]), "--work-dir", str(work),
                  "-o", str(tmp_path / "model.tar")],
                 tune_argv(tiny, tuner, work, 5)):  # fmt: skip
        assert main(argv) == 3, argv[0]
        err = capsys.readouterr().err
        assert "not a regular file" in err, (argv[0], err)
        assert name in err, err
    assert not (tmp_path / "model.tar").exists()


def test_a_task_name_does_not_place_files_outside_the_work_dir(tmp_path) -> None:
    from relay_tasks.adapters.meta_schedule.session import _file_part

    assert _file_part("../../etc/x") == "______etc_x"
    assert _file_part("fused_nn_dense_add") == "fused_nn_dense_add"


def test_a_cut_line_is_not_set_aside_through_a_link(tiny, tuned, tmp_path, capsys) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere.txt"
    shutil.copytree(tuned["autotvm"], work)
    elsewhere.write_text("the user's file\n")
    log = work / LOGS["autotvm"]
    log.write_text(log.read_text()[:-20])  # a cut last line
    (work / f"{log.name}.damaged").symlink_to(elsewhere)
    assert main(tune_argv(tiny, "autotvm", work, 5)) == 7
    assert "cannot set aside the cut last line" in capsys.readouterr().err
    assert elsewhere.read_text() == "the user's file\n"


def _annotated(line: str) -> str:
    """A MetaSchedule record whose trace also annotates its first block with LLVM IR to link."""
    record = json.loads(line)
    record[1][0][0].insert(1, ["Annotate", ["b0", '"define void @f() { ret void }"'],
                               ["pragma_import_llvm"], []])  # fmt: skip
    return json.dumps(record)


def _autotvm_knob(line: str) -> str:
    record = json.loads(line)
    record["config"]["entity"].append(["unroll_explicit", "ot", "__import__('os')"])
    return json.dumps(record)


def _ansor_pragma(line: str) -> str:
    """An Ansor record whose steps end with a pragma naming LLVM IR to import."""
    record = json.loads(line)
    record["i"][1][1].append(["PR", 0, 0, "import_llvm"])
    return json.dumps(record)


#: Per tuner: a record changed as a work dir from elsewhere could hold it, and the refusal.
RECORD_ATTACKS = {
    "meta_schedule": (_annotated, "its trace annotates 'pragma_import_llvm'"),
    "autotvm": (_autotvm_knob, "its knob 'unroll_explicit' has the value \"__import__('os')\""),
    "ansor": (_ansor_pragma, "it asks for the pragma 'import_llvm', which Ansor does not write"),
}


@pytest.mark.parametrize("tuner", TUNERS)
def test_a_record_outside_the_allowlist_is_refused_before_a_tuner_reads_it(
    tuner, tiny, tuned, tmp_path, capsys
) -> None:
    """Issue 26: a record is replayed on resume and by compile, and a schedule can carry code
    (an annotation or pragma named ``pragma_import_llvm`` makes codegen link LLVM IR)."""
    work = tmp_path / "work"
    shutil.copytree(tuned[tuner], work)
    log = work / LOGS[tuner]
    lines = log.read_text().splitlines()
    change, message = RECORD_ATTACKS[tuner]
    number = 1  # the first record: every work dir has one
    log.write_text("\n".join([change(lines[0]), *lines[1:]]) + "\n")
    for argv in (tune_argv(tiny, tuner, work, 5), ["status", "--work-dir", str(work)]):
        assert main(argv) == 3
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1
        assert f"{log}, line {number}: not a record the tuner wrote ({message}" in err


def _object_json(text: str):
    """A MetaSchedule record whose first instruction's input is ``text`` (TVM reads an input
    written ``{...}`` with its object JSON reader)."""

    def change(line: str) -> str:
        record = json.loads(line)
        record[1][0][0][0][1].append(text)
        return json.dumps(record)

    return change


def _index_map(change) -> str:
    """A real index map's object JSON, changed by ``change(nodes)``."""
    from tvm import ir, tir

    document = json.loads(ir.save_json(tir.IndexMap.from_func(lambda i, j: [j, i // 4, i % 4])))
    change(document["nodes"])
    return json.dumps(document)


def _retyped(nodes) -> None:
    """A variable whose name refers to an integer: TVM would store it without a type check."""
    var = next(n for n in nodes if n["type_key"] == "tir.Var")
    var["attrs"]["name"] = str(next(i for i, n in enumerate(nodes) if n["type_key"] == "IntImm"))


def _looped(nodes) -> None:
    """An expression that holds itself."""
    index = next(i for i, n in enumerate(nodes) if n["type_key"] == "tir.FloorDiv")
    nodes[index]["attrs"]["a"] = str(index)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"root": 1, "nodes": [{"type_key": ""}, {"type_key": "runtime.Module"}]}',
         "no index map at its root"),
        (_index_map(lambda nodes: nodes.append({"type_key": "tir.StringImm", "attrs": {}})),
         "the node type 'tir.StringImm'"),
        (_index_map(_retyped), "tir.Var.name refers to a node of another type"),
        (_index_map(_looped), "a cycle of references"),
        (' {"root": 1', "it is not TVM object JSON"),
    ],
)  # fmt: skip
def test_object_json_in_a_trace_must_be_an_index_map(text, problem, tuned, tmp_path, capsys):
    """Issue 26: TVM's object JSON reader builds whatever node types a text names and sets each
    reference without a type check; a trace may hold only index maps of integer arithmetic."""
    work = tmp_path / "work"
    shutil.copytree(tuned["meta_schedule"], work)
    log = work / LOGS["meta_schedule"]
    lines = log.read_text().splitlines()
    log.write_text("\n".join([_object_json(text)(lines[0]), *lines[1:]]) + "\n")
    assert main(["status", "--work-dir", str(work)]) == 3
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert (
        "line 1: not a record the tuner wrote (its GetBlock instruction holds object JSON " in err
    )
    assert problem in err


def test_a_workload_lines_module_is_never_read(tiny, tuned, tmp_path, capsys) -> None:
    """Issue 26: a workload line's module (TVM object JSON) is replaced by one that would crash
    TVM's reader (a reference to a node that does not exist); its structural hash still names
    the task. The module is derived here: the tune resumes and compile builds."""
    import base64

    work = tmp_path / "work"
    shutil.copytree(tuned["meta_schedule"], work)
    workloads = work / "database_workload.json"
    hostile = b'{"root": 1, "nodes": [{"type_key": ""}, {"type_key": "Array", "data": [99]}]}'
    text = base64.b64encode(len(hostile).to_bytes(8, "little") + hostile).decode()
    lines = [json.dumps([json.loads(line)[0], text]) for line in workloads.read_text().splitlines()]
    workloads.write_text("\n".join(lines) + "\n")
    assert main(tune_argv(tiny, "meta_schedule", work, 5)) == 0
    assert valid_count(work, "meta_schedule") == 5
    text_model, params = tiny
    library = tmp_path / "m.so"
    argv = ["compile", str(text_model), "--params", str(params), "--work-dir", str(work)]
    assert main([*argv, "-o", str(library)]) == 0, capsys.readouterr().err
    assert library.exists()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda knob: knob[2].__setitem__(-1, 7), "is outside its task's config space"),
        (lambda knob: knob.__setitem__(0, "unroll_depth"), "its knobs are not those of its task"),
    ],
)
def test_an_autotvm_record_chooses_only_inside_its_config_space(
    change, problem, tiny, tuned, tmp_path, capsys
) -> None:
    """Issue 26: AutoTVM applies a record's knobs as written; a split no search draws (7 does
    not divide the dense's 16 or 32) is refused by tune and compile before AutoTVM reads it."""
    work = tmp_path / "work"
    shutil.copytree(tuned["autotvm"], work)
    log = work / LOGS["autotvm"]
    lines = log.read_text().splitlines()
    record = json.loads(lines[0])
    change(next(k for k in record["config"]["entity"] if k[1] == "sp"))
    log.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    text, params = tiny
    compile_argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work)]
    for argv in (
        tune_argv(tiny, "autotvm", work, 5),
        [*compile_argv, "-o", str(tmp_path / "m.so")],
    ):
        assert main(argv) == 3
        err = capsys.readouterr().err
        assert (
            len(err.splitlines()) == 1 and f"{log}, line 1: not a record the tuner wrote (" in err
        )
        assert problem in err
    assert not (tmp_path / "m.so").exists()
