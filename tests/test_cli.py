"""The CLI, run in-process: exact outputs, and one line plus an exit code for every bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relay

from relay_tasks.cli import EXIT_USAGE, build_parser, main
from relay_tasks.errors import ModelError, TargetError, UsageError
from relay_tasks.loaders import load_model

import oracles
from zoo import CUDA, HOST, X86

FIELDS = {"index", "name", "weight", "anchor_op", "gflop", "key", "models", "group", "payload"}
# dense of 1x8 by 4x8 is 2*1*4*8 = 64 FLOPs (a multiply and an add each), bias 4, relu 4: 72.
TINY_TABLE = """\
#  task                        weight    GFLOP   share  anchor op
0  fused_nn_dense_add_nn_relu       1  7.2e-08  100.0%  nn.dense
"""
#: What extract says on stderr, on a terminal or a pipe: its tasks and where the time went.
EXTRACTED = r"relay-tasks: {tasks} tasks in [0-9]+\.[0-9]{{2}} s \(loading the model: [0-9]+\.[0-9]{{2}} s\)"


@pytest.fixture()
def tiny_model(tmp_path: Path) -> tuple[Path, Path]:
    """dense + bias + relu as Relay text and a params file, as a user would save them."""
    data = relay.var("data", shape=(1, 8))
    w, b = relay.var("w", shape=(4, 8)), relay.var("b", shape=(4,))
    func = relay.Function(
        [data, w, b], relay.nn.relu(relay.nn.bias_add(relay.nn.dense(data, w), b))
    )
    text_path, params_path = tmp_path / "tiny.relay", tmp_path / "tiny.params"
    text_path.write_text(tvm.IRModule.from_expr(func).astext())
    rng = np.random.default_rng(0)
    params = {
        "w": tvm.nd.array(rng.standard_normal((4, 8)).astype("float32")),
        "b": tvm.nd.array(rng.standard_normal(4).astype("float32")),
    }
    params_path.write_bytes(relay.save_param_dict(params))
    return text_path, params_path


def test_table_for_a_relay_text_model(tiny_model, capsys) -> None:
    text, params = tiny_model
    assert main(["extract", str(text), "--params", str(params), "--target", X86]) == 0
    assert capsys.readouterr().out == TINY_TABLE
    # The row is upstream's task: one fused dense + bias + relu.
    mod = tvm.relay.parse(text.read_text())
    (upstream,) = tvm.meta_schedule.relay_integration.extract_tasks(
        mod, tvm.target.Target(X86), relay.load_param_dict(params.read_bytes())
    )
    assert (upstream.task_name, upstream.weight) == ("fused_nn_dense_add_nn_relu", 1)


def test_json_for_a_zoo_model_matches_upstream(capsys) -> None:
    assert main(["extract", "resnet-18", "--target", X86, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    upstream = oracles.meta_schedule("resnet-18", X86)
    assert document["target"] == str(tvm.target.Target(X86))
    assert document["tuner"] == "meta_schedule"
    assert document["models"] == ["resnet-18"] and document["format"] == "relay-tasks/3"
    assert [(t["index"], t["name"], t["weight"]) for t in document["tasks"]] == [
        (i, t.task_name, t.weight) for i, t in enumerate(upstream)
    ]
    assert {t["anchor_op"] for t in document["tasks"]} >= {"nn.contrib_conv2d_NCHWc", "nn.dense"}
    assert set(document["tasks"][0]) == FIELDS


def test_output_file_gets_the_result_and_stdout_stays_empty(tiny_model, tmp_path, capsys) -> None:
    text, params = tiny_model
    out_file = tmp_path / "tasks.txt"
    assert (
        main(["extract", str(text), "--params", str(params), "--target", X86, "-o", str(out_file)])
        == 0
    )
    assert capsys.readouterr().out == ""
    assert out_file.read_text() == TINY_TABLE


def test_module_equality_option(capsys) -> None:
    assert (
        main(
            [
                "extract",
                "resnet-18",
                "--target",
                CUDA,
                "--module-equality",
                "anchor-block",
                "--format",
                "json",
            ]
        )
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    upstream = oracles.meta_schedule("resnet-18", CUDA, "anchor-block")
    assert [t["name"] for t in document["tasks"]] == [t.task_name for t in upstream]


def test_default_model_is_resnet_50_for_the_host_cpu() -> None:
    args = build_parser().parse_args(["extract"])
    assert (args.models, args.target, args.tuner, args.format) == (
        ["resnet-50"],
        None,
        "meta_schedule",
        "table",
    )


def _bad_text(tmp_path: Path) -> Path:
    path = tmp_path / "bad.relay"
    path.write_text(
        '#[version = "0.0.5"]\ndef @main(%x: Tensor[(1, 4), float32]) { nn.relux(%x) }\n'
    )
    return path


def _bad_params(tmp_path: Path) -> list[str]:
    path = tmp_path / "garbage.params"
    path.write_bytes(b"not a params file")
    return ["--params", str(path)]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (
            ["extract", "no-such-model"],
            ModelError.exit_code,
            "no-such-model: no such file, and not a built-in model (built-ins: resnet-18,",
        ),
        (
            ["extract", "resnet-18", "--target", "gpu9000"],
            TargetError.exit_code,
            "unknown or malformed target 'gpu9000'",
        ),
        (
            ["extract", "{bad_text}"],
            ModelError.exit_code,
            "not valid Relay text: operator `nn.relux` not found",
        ),
        (
            ["extract", "{tiny}", "{bad_params}"],
            ModelError.exit_code,
            "garbage.params: not a params file written by relay.save_param_dict",
        ),
        (
            ["extract", "resnet-18", "--params", "x.params"],
            ModelError.exit_code,
            "resnet-18: --params applies to Relay text models only; drop it",
        ),
        (
            ["extract", "{tiny}", "-o", "/nonexistent/dir/out.txt", "--target", X86],
            ModelError.exit_code,
            "/nonexistent/dir/out.txt: cannot write the output file",
        ),
        (
            ["extract", "resnet-18", "--target", "llvm -mtriple=x86_64-linux-gnu -mcpu=skylak"],
            TargetError.exit_code,
            "-mcpu=skylak is not a CPU LLVM knows for x86_64-linux-gnu; did you mean skylake",
        ),
        (
            ["tune", "{tiny}", "--work-dir", "{file}", "--target", X86],
            UsageError.exit_code,
            "is a file; give a directory",
        ),
        (
            ["tune", "{tiny}", "--work-dir", "w", "--trials", "0"],
            UsageError.exit_code,
            "trials must be a whole number of at least 1, got 0",
        ),
        (
            ["tune", "{tiny}", "--work-dir", "w", "--rpc-tracker", "localhost"],
            UsageError.exit_code,
            "cannot use RPC tracker 'localhost': give --rpc-tracker HOST:PORT and --rpc-key KEY",
        ),
        (
            ["tune", "{tiny}", "--work-dir", "w", "--rpc-key", "k"],
            UsageError.exit_code,
            "--rpc-key needs --rpc-tracker HOST:PORT",
        ),
        (
            ["extract", "{tiny}", "--input-shapes", "data:[1,x]"],
            UsageError.exit_code,
            "input shape for 'data' must be integers, got [1,x]",
        ),
        (
            ["extract", "{tiny}", "--input-shapes", "data=1,8"],
            UsageError.exit_code,
            "cannot read input shapes 'data=1,8'; write them as name:[d0,d1,...]",
        ),
        (
            [
                "extract",
                "{tiny}",
                "resnet-18",
                "--input-shapes",
                "a:[1]",
                "--input-shapes",
                "b:[1]",
                "--input-shapes",
                "c:[1]",
            ],
            UsageError.exit_code,
            "--input-shapes given 3 times for 2 models: give it once (for every model) or once "
            "per model, in order",
        ),
        (
            ["extract", "{tiny}", "--input-shapes", "data:[1,8]:float16"],  # the dtype reaches it
            ModelError.exit_code,
            "tiny.relay: the model does not type-check with these input shapes",
        ),
        (
            ["extract", "{tiny}", "--input-shapes", "image:[1,8]"],
            ModelError.exit_code,
            "tiny.relay: no input named image; the inputs are data, w, b",
        ),
        (
            ["extract", "{tiny}", "--tuner", "autotvm", "--module-equality", "anchor-block"],
            UsageError.exit_code,
            "--module-equality applies to --tuner meta_schedule only",
        ),
    ],
    ids=[
        "unknown-model",
        "unknown-target",
        "bad-relay-text",
        "bad-params-file",
        "params-for-zoo",
        "unwritable-output",
        "unknown-cpu",
        "work-dir-is-a-file",
        "zero-trials",
        "tracker-without-port",
        "key-without-tracker",
        "shape-not-integers",
        "shape-syntax",
        "shapes-per-model-count",
        "shape-dtype-that-does-not-type-check",
        "shape-for-no-input",
        "module-equality-for-autotvm",
    ],
)
def test_errors_are_one_line_and_an_exit_code(
    argv, code, message, tiny_model, tmp_path, capsys, monkeypatch
):
    text, _ = tiny_model
    fill = {
        "{bad_text}": [str(_bad_text(tmp_path))],
        "{tiny}": [str(text)],
        "{bad_params}": _bad_params(tmp_path),
        "{file}": [str(tmp_path / "a-file")],
    }
    (tmp_path / "a-file").write_text("")
    monkeypatch.chdir(tmp_path)
    args = [a for arg in argv for a in fill.get(arg, [arg])]
    assert main(args) == code
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert lines[-1].startswith("relay-tasks: error: ")
    # The message as whole words, not inside longer ones.
    assert re.search(rf"(?<!\w){re.escape(message)}(?!\w)", lines[-1]), lines[-1]
    assert "Traceback" not in err


def test_params_of_another_model_fail_in_one_line(tiny_model, tmp_path, capsys) -> None:
    text, _ = tiny_model
    other = tmp_path / "other.params"
    other.write_bytes(relay.save_param_dict({"weight": tvm.nd.array(np.zeros(2, "float32"))}))
    assert main(["extract", str(text), "--params", str(other), "--target", X86]) == 3
    err = capsys.readouterr().err.strip()
    assert err == (
        "relay-tasks: error: none of the 1 param(s) match a parameter of main: weight; main's "
        "parameters are: data, w, b; these look like another model's weights: pass this "
        "model's params, or none"
    )


def test_params_that_match_nothing_are_a_one_line_warning(tiny_model, tmp_path, capsys) -> None:
    text, params = tiny_model
    weights = dict(relay.load_param_dict(params.read_bytes()))
    extra = tmp_path / "extra.params"
    extra.write_bytes(relay.save_param_dict({**weights, "bn.num_batches_tracked": tvm.nd.array(
        np.zeros((), "int64"))}))  # fmt: skip
    assert main(["extract", str(text), "--params", str(extra), "--target", X86]) == 0
    out, err = capsys.readouterr()
    assert out == TINY_TABLE  # w and b are bound as before
    warning, extracted = err.splitlines()
    assert warning == (
        "relay-tasks: warning: 1 param(s) match no parameter of main and are not bound: "
        "bn.num_batches_tracked; drop them from params to silence this (upstream ignores them "
        "without a word)"
    )
    assert re.fullmatch(EXTRACTED.format(tasks=1), extracted)


def _unwrapped(text: str) -> str:
    """argparse wraps usage lines at the terminal's width: one line, single spaces."""
    return " ".join(text.split())


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["extract", "--format", "yaml"])
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "invalid choice: 'yaml' (choose from 'table', 'json')" in err
    # The usage line names the program and the placeholders the README uses.
    assert err.startswith("usage: relay-tasks extract [-h]") and "[MODEL ...]" in err
    with pytest.raises(SystemExit):
        main(["tune", "--work-dir", "w"])
    assert "relay-tasks tune: error: the following arguments are required: MODEL|TASKS.json" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["frobnicate"])
    assert "argument VERB: invalid choice: 'frobnicate'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compile"])
    assert "required: MODEL, --work-dir, -o/--output" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["status", "--work-dir", "w", "--model-format", "yaml"])
    usage = _unwrapped(capsys.readouterr().err)
    assert usage.startswith("usage: relay-tasks status [-h]")
    assert "--work-dir WORK_DIR [--plot FILE.png] [--format {table,json}] [MODEL ...]" in usage
    with pytest.raises(SystemExit):
        main(["tune", "--tuner", "nope"])
    assert "[--rpc-tracker HOST:PORT] [--rpc-key KEY]" in _unwrapped(capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["serve", "--port", "nope"])
    assert "serve [-h] --tracker HOST:PORT --key KEY" in _unwrapped(capsys.readouterr().err)


@pytest.mark.parametrize("tuner", ["autotvm", "ansor"])
@pytest.mark.parametrize("target", [X86, CUDA])
def test_every_tuner_gives_the_same_json_shape(tuner: str, target: str, capsys) -> None:
    """DCGAN (built in, small: its upstream oracles take a few seconds, ResNet-18's a quarter of
    a minute each) through the CLI, for the tuners whose JSON carries templates and keys."""
    from cuda_schedules import cuda_injective_schedules

    with cuda_injective_schedules():  # for upstream's AutoTVM oracle on CUDA only
        expected = (
            [name for name, _ in oracles.autotvm_tasks("dcgan", target)]
            if tuner == "autotvm"
            else [
                ",".join(sorted(d.split(","))) for _, d, _ in oracles.ansor_tasks("dcgan", target)
            ]
        )
    assert len(expected) >= 5
    argv = ["extract", "dcgan", "--target", target, "--tuner", tuner, "--format", "json"]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["tuner"] == tuner
    assert [t["name"] for t in document["tasks"]] == expected
    assert all(set(t) == FIELDS for t in document["tasks"])
    if tuner == "ansor":
        weights = [w for _, _, w in oracles.ansor_tasks("dcgan", target)]
        assert [t["weight"] for t in document["tasks"]] == weights


@pytest.mark.parametrize(
    ("tuner", "code", "message"),
    [
        (
            "meta_schedule",
            0,
            "relay-tasks: warning: fused_nn_dense_nn_relu has the dynamic shape (?, 8): MetaSchedule cannot tune it",
        ),
        (
            "autotvm",
            3,
            "relay-tasks: error: AutoTVM cannot make a dense_pack.x86 task of fused_nn_dense_nn_relu: its shape (?, 8) is dynamic",
        ),
    ],
)
def test_dynamic_shapes_get_one_line(tuner: str, code: int, message: str, tmp_path, capsys) -> None:
    text = tmp_path / "dynamic.relay"
    data, w = relay.var("data", shape=(relay.Any(), 8)), relay.var("w", shape=(4, 8))
    text.write_text(
        tvm.IRModule.from_expr(
            relay.Function([data, w], relay.nn.relu(relay.nn.dense(data, w)))
        ).astext()
    )
    assert main(["extract", str(text), "--target", X86, "--tuner", tuner]) == code
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(message), lines
    # A warning, then the extraction's line; an error is the only line.
    assert lines[1:] == [] if code else re.fullmatch(EXTRACTED.format(tasks=0), lines[1]), lines


def test_serve_listens_on_this_machine_only_unless_told() -> None:
    """An RPC server runs what it is sent: reaching it from elsewhere must be asked for."""
    import inspect

    from relay_tasks.cli import build_parser
    from relay_tasks.rpc import start_server

    parse = build_parser().parse_args
    assert parse(["serve", "--tracker", "h:9190", "--key", "k"]).host == "127.0.0.1"
    assert parse(["serve", "--tracker", "h:9190", "--key", "k", "--host", "0.0.0.0"]).host == (
        "0.0.0.0"
    )
    assert inspect.signature(start_server).parameters["host"].default == "127.0.0.1"


def test_params_of_the_wrong_shape_name_the_param_and_both_shapes(tiny_model, tmp_path, capsys):
    text, _ = tiny_model
    params = tmp_path / "wrong.params"
    params.write_bytes(relay.save_param_dict({"w": tvm.nd.array(np.zeros((8, 4), "float32"))}))
    assert main(["extract", str(text), "--params", str(params), "--target", X86]) == 3
    assert capsys.readouterr().err.strip() == (
        "relay-tasks: error: param 'w' is 8x4 float32, but main declares 'w' as 4x8 float32; "
        "pass the weights this model was built with"
    )


def test_input_shapes_retype_a_relay_text_model_and_apply_per_model(tiny_model, capsys) -> None:
    """Batch 3 instead of 1: the model's input follows; one spec per model, in order."""
    text, params = tiny_model
    mod, _ = load_model(text, params=params, shapes={"data": [3, 8]})
    assert [int(d) for d in mod["main"].params[0].checked_type.shape] == [3, 8]
    assert [int(d) for d in mod["main"].checked_type.ret_type.shape] == [3, 4]
    base = ["extract", str(text), str(text), "--target", X86, "--format", "json"]
    assert main([*base, "--input-shapes", "data:[3,8]"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tasks"]) == 1  # the same task, merged
    assert main([*base, "--input-shapes", "data:[3,8]", "--input-shapes", "data:[5,8]"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tasks"]) == 2  # batch 3 and batch 5


def test_status_lines_go_to_a_terminal_and_never_to_stdout(tiny_model) -> None:
    """On a terminal stderr gets "N tasks in X s"; stdout holds the table alone either way."""
    import os
    import pty
    import subprocess
    import sys

    text, params = tiny_model
    command = [sys.executable, "-m", "relay_tasks.cli", "extract", str(text), "--params",
               str(params), "--target", X86]  # fmt: skip
    main_fd, terminal = pty.openpty()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=terminal) as child:
        os.close(terminal)
        out = child.stdout.read().decode() if child.stdout else ""
        child.wait()
    shown = os.read(main_fd, 4096).decode()
    os.close(main_fd)
    assert out == TINY_TABLE
    assert re.fullmatch(EXTRACTED.format(tasks=1), shown.strip()), shown
    piped = subprocess.run(command, capture_output=True, text=True, check=True)
    assert piped.stdout == TINY_TABLE  # the extraction's line goes to stderr on a pipe too
    assert re.fullmatch(EXTRACTED.format(tasks=1), piped.stderr.strip()), piped.stderr


def test_the_commands_quick_exit_keeps_its_output_and_codes(tiny_model, tmp_path) -> None:
    """``extract`` leaves without tearing the process down: its whole output still arrives on a
    pipe, and an error keeps its one line and its code."""
    import subprocess
    import sys

    text, params = tiny_model
    command = [sys.executable, "-m", "relay_tasks.cli", "extract", str(text), "--params",
               str(params), "--target", X86, "--format", "json"]  # fmt: skip
    piped = subprocess.run(command, capture_output=True, text=True, check=True)
    assert len(json.loads(piped.stdout)["tasks"]) == 1
    missing = subprocess.run([*command[:4], str(tmp_path / "none.relay")], capture_output=True,
                             text=True)  # fmt: skip
    assert missing.returncode == ModelError.exit_code and missing.stdout == ""
    assert missing.stderr.startswith("relay-tasks: error:") and missing.stderr.count("\n") == 1


def test_each_verb_parses_to_its_documented_defaults() -> None:
    """The defaults the README's usage relies on, verb by verb; omitted required options and
    unknown choices are usage errors."""
    parse = build_parser().parse_args
    ext = parse(["extract"])
    assert (ext.models, ext.format, ext.output, ext.tuner, ext.target) == (
        ["resnet-50"],
        "table",
        None,
        "meta_schedule",
        None,
    )
    assert (ext.module_equality, ext.model_format, ext.input_shapes, ext.params) == (
        None,
        None,
        None,
        None,
    )
    tune = parse(["tune", "tasks.json", "--work-dir", "w"])
    # No budget given: 64 trials (set where tune is called), no time budget.
    assert (tune.models, tune.trials, tune.time, tune.timeout, tune.work_dir) == (
        ["tasks.json"],
        None,
        None,
        10.0,
        "w",
    )
    assert (tune.rpc_tracker, tune.rpc_key, tune.tuner) == (None, None, "meta_schedule")
    status = parse(["status", "--work-dir", "w"])
    assert (status.models, status.plot) == ([], None)
    build = parse(["compile", "m.onnx", "--work-dir", "w", "-o", "m.tar"])
    assert (build.models, build.output, build.benchmark) == (["m.onnx"], "m.tar", False)
    assert parse(["compile", "m", "--work-dir", "w", "-o", "x", "--benchmark"]).benchmark is True
    serve = parse(["serve", "--tracker", "h:1", "--key", "k"])
    assert (serve.host, serve.port, serve.tracker, serve.key) == ("127.0.0.1", 9090, "h:1", "k")
    many = parse(["extract", "a", "b", "--input-shapes", "x:[1]", "--input-shapes", "y:[2]"])
    assert (many.models, many.input_shapes) == (["a", "b"], ["x:[1]", "y:[2]"])
    typed = parse(["tune", "t", "--work-dir", "w", "--trials", "7", "--timeout", "1.5"])
    assert (typed.trials, typed.timeout) == (7, 1.5)
    for spelled, seconds in (
        ("30m", 1800),
        ("1h30m", 5400),
        ("90s", 90),
        ("45", 45),
        ("2.5m", 150),
    ):
        assert parse(["tune", "t", "--work-dir", "w", "--time", spelled]).time == seconds
    for bad in (
        ["tune", "t"],  # no --work-dir
        ["tune", "--work-dir", "w"],  # no model
        ["status"],
        ["compile", "m", "--work-dir", "w"],  # no -o
        ["compile", "m", "n", "--work-dir", "w", "-o", "x"],  # one model only
        ["serve", "--key", "k"],
        ["serve", "--tracker", "h:1"],
        ["extract", "--format", "xml"],
        ["extract", "--tuner", "tvm"],
        ["extract", "--module-equality", "loose"],
        ["extract", "--model-format", "caffe"],
        ["tune", "t", "--work-dir", "w", "--trials", "many"],
        ["tune", "t", "--work-dir", "w", "--time", "soon"],
        ["tune", "t", "--work-dir", "w", "--time", "0m"],
        ["tune", "t", "--work-dir", "w", "--time", "5d"],
        [],
    ):
        with pytest.raises(SystemExit) as caught:
            parse(bad)
        assert caught.value.code == EXIT_USAGE, bad


def _task_file(tiny_model, path: Path, tuner: str, target: str = X86) -> Path:
    text, params = tiny_model
    argv = ["extract", str(text), "--params", str(params), "--target", target, "--tuner", tuner,
            "--format", "json", "-o", str(path)]  # fmt: skip
    assert main(argv) == 0
    return path


@pytest.fixture()
def tune_calls(monkeypatch) -> list[tuple]:
    """``relay_tasks.tuning.tune`` replaced: the verb's arguments are recorded, nothing tunes
    (tests/tuning tunes for real)."""
    import relay_tasks.tuning as tuning

    calls: list[tuple] = []

    def record(tasks, target, **options):
        calls.append((tasks, target, options))
        return tuning.standing(tasks, [])

    monkeypatch.setattr(tuning, "tune", record)
    return calls


def test_tune_hands_the_models_tasks_and_every_option_to_the_tuner(
    tiny_model, tune_calls, tmp_path, capsys
) -> None:
    from relay_tasks import extract
    from relay_tasks.adapters import get_adapter
    from relay_tasks.tuning import standing
    from relay_tasks.tuning.status import format_status, task_flops

    text, params = tiny_model
    work = str(tmp_path / "w")
    argv = ["tune", str(text), "--params", str(params), "--target", X86, "--tuner", "autotvm",
            "--trials", "7", "--work-dir", work, "--rpc-tracker", "h:9190", "--rpc-key", "k",
            "--timeout", "3.5", "--reuse", "a", "b", "--time", "1h", "--no-seeds"]  # fmt: skip
    assert main(argv) == 0
    ((tasks, target, options),) = tune_calls
    mod, weights = load_model(text, params=params)
    expected = extract(mod, X86, weights, tuner="autotvm")
    assert [(t.name, t.key) for t in tasks] == [(t.name, t.key) for t in expected]
    assert str(target) == str(tvm.target.Target(X86))
    assert options == {"tuner": "autotvm", "trials": 7, "work_dir": work,
                       "rpc_tracker": "h:9190", "rpc_key": "k", "timeout": 3.5, "reuse": ["a", "b"],
                       "time_budget": 3600.0, "seeds": False}  # fmt: skip
    flops = task_flops(get_adapter("autotvm"), tasks)
    assert capsys.readouterr().out == format_status(standing(tasks, []), flops) + "\n"


def test_tune_takes_a_task_file_for_its_own_tuner_and_target(
    tiny_model, tune_calls, tmp_path, capsys
) -> None:
    from relay_tasks.export import load_tasks

    tasks_json = _task_file(tiny_model, tmp_path / "tasks.json", "ansor")
    work = str(tmp_path / "w")
    assert main(["tune", str(tasks_json), "--tuner", "ansor", "--work-dir", work]) == 0
    ((tasks, target, options),) = tune_calls
    assert [t.key for t in tasks] == [t.key for t in load_tasks(tasks_json).tasks]
    assert str(target) == str(tvm.target.Target(X86))
    assert (options["tuner"], options["trials"], options["timeout"]) == ("ansor", 64, 10.0)
    capsys.readouterr()
    refusals = {
        (): f"{tasks_json} holds ansor tasks for {tvm.target.Target(X86)}; drop --target and "
        "use --tuner ansor",
        ("--tuner", "ansor", "--target", X86): None,
        (str(tiny_model[0]), "--tuner", "ansor"): "give either one task file or model files, "
        "not both",
    }
    for extra, message in refusals.items():
        argv = ["tune", str(tasks_json), *extra, "--work-dir", work]
        assert main(argv) == EXIT_USAGE
        err = capsys.readouterr().err
        assert err == f"relay-tasks: error: {message or refusals[()]}\n"
    assert len(tune_calls) == 1


def test_status_reads_the_work_dirs_task_file_or_the_models_tasks(
    tiny_model, tmp_path, monkeypatch, capsys
) -> None:
    """Before any measurement: every task at zero, from the task file a tune leaves, or from
    the model (extracted for the work dir's tuner and target, CUDA here, not this CPU); --plot
    draws the same standing."""
    import relay_tasks.tuning.status as status_module
    from relay_tasks.adapters import get_adapter
    from relay_tasks.export import load_tasks
    from relay_tasks.tuning import standing
    from relay_tasks.tuning.status import format_status, task_flops

    work = tmp_path / "w"
    work.mkdir()
    tasks = load_tasks(_task_file(tiny_model, work / "tasks.json", "autotvm", CUDA)).tasks
    assert [t.name for t in tasks] == ["dense_small_batch.gpu"]
    capsys.readouterr()
    expected = format_status(standing(tasks, []), task_flops(get_adapter("autotvm"), tasks))
    assert main(["status", "--work-dir", str(work)]) == 0
    assert capsys.readouterr().out == expected + "\n"
    text, params = tiny_model
    assert main(["status", str(text), "--params", str(params), "--work-dir", str(work)]) == 0
    assert capsys.readouterr().out == expected + "\n"
    drawn: list[tuple] = []
    monkeypatch.setattr(status_module, "plot", lambda *args: drawn.append(args))
    assert main(["status", "--work-dir", str(work), "--plot", "p.png"]) == 0
    ((path, now, records, title),) = drawn
    assert (path, records, title) == ("p.png", [], f"{work}: autotvm for {tvm.target.Target(CUDA)}")
    assert [(r.task.key, r.valid, r.best) for r in now.tasks] == [(t.key, 0, None) for t in tasks]
    assert main(["status", "--work-dir", str(tmp_path)]) == EXIT_USAGE
    assert "is not a relay-tasks work dir" in capsys.readouterr().err


def test_compile_builds_with_the_work_dirs_records_and_benchmarks(
    tiny_model, tmp_path, monkeypatch, capsys
) -> None:
    """No record yet: the library is built with default schedules and says so; --benchmark runs
    it against the untuned build; a tracker is asked for the device only with --benchmark."""
    import relay_tasks.cli as cli

    work = tmp_path / "w"
    work.mkdir()
    _task_file(tiny_model, work / "tasks.json", "meta_schedule", HOST)  # --benchmark runs it
    capsys.readouterr()
    text, params = tiny_model
    library = tmp_path / "tiny.tar"
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(library)]  # fmt: skip
    assert main(argv) == EXIT_USAGE  # records that cover nothing: said, unless asked for
    assert capsys.readouterr().err == (
        f"relay-tasks: error: {work} holds no valid record of {text}'s 1 tasks yet; tune {text} "
        f"there first (relay-tasks tune {text} --work-dir {work}), or pass --untuned to build it "
        "with TVM's default schedules\n"
    )
    assert not library.exists()
    argv.append("--untuned")
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{text}: 0/1 tasks tuned, library in {library}\n"
    assert captured.err == (
        "relay-tasks: the records cover 0 of the model's 1 tasks; not tuned (built with default "
        "schedules): fused_nn_dense_add_nn_relu\n"
        "relay-tasks: built 1 function(s) without a record, as said above (TVM's messages: "
        f"{work / 'tune.log'})\n"
    )
    assert library.stat().st_size > 0
    assert main([*argv, "--benchmark"]) == 0
    (_, benchmark) = capsys.readouterr().out.splitlines()
    assert benchmark.startswith("tuned ") and " repeats), untuned " in benchmark
    assert float(benchmark.rsplit(" ", 1)[1]) < 1e-5  # both builds compute the same
    assert main([*argv, "--rpc-tracker", "h:9190", "--rpc-key", "k"]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "relay-tasks: error: --rpc-tracker applies to --benchmark only\n"
    )
    asked: list[tuple] = []

    def no_device(tracker, key):
        asked.append((tracker, key))
        raise cli.UsageError("no device here")

    monkeypatch.setattr(cli, "_remote", no_device)
    tracked = [*argv, "--benchmark", "--rpc-tracker", "h:9190", "--rpc-key", "k"]
    assert main(tracked) == EXIT_USAGE
    assert asked == [(("h", 9190), "k")]
    import relay_tasks.tuning.compile as building

    ran_on: list[object] = []

    def run_remotely(factories, inputs, *, remote=None, others=()):
        ran_on.append((len(factories), remote))
        return [building.Run([1e-3], [np.zeros(4, "float32")]) for _ in factories]

    monkeypatch.setattr(cli, "_remote", lambda tracker, key: "the device")
    monkeypatch.setattr(building, "compare", run_remotely)
    assert main(tracked) == 0
    assert ran_on == [(2, "the device")]  # the tuned build and the untuned one, in turn


def test_compile_profiles_the_library_it_built(tiny_model, tmp_path, capsys) -> None:
    """--profile prints, after the library's line, each function's time in the model; with
    --benchmark, beside the model's own latency. A work dir for a GPU is refused before
    anything is built."""
    work = tmp_path / "w"
    work.mkdir()
    _task_file(tiny_model, work / "tasks.json", "meta_schedule", HOST)
    text, params = tiny_model
    library = tmp_path / "tiny.tar"
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(work),
            "-o", str(library), "--untuned", "--profile"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 0
    built, header, row, total = capsys.readouterr().out.splitlines()
    assert built == f"{text}: 0/1 tasks tuned, library in {library}"
    assert header.split() == ["ms", "in", "model", "share", "calls", "ms", "a", "call", "function"]
    assert row.split()[1:3] == ["100.0%", "1"]  # the model is one call of one function
    assert row.split()[3] == row.split()[0]  # a call takes all its time
    assert row.split()[4].startswith("fused_nn_") and "dense" in row.split()[4]
    assert float(row.split()[0]) > 0
    assert total.strip().startswith(f"the calls add up to {row.split()[0]} ms (")
    assert main([*argv, "--benchmark"]) == 0
    *_, total = capsys.readouterr().out.splitlines()
    assert re.search(r" runs\); the model ran [0-9.e-]+ ms, the rest between the calls$", total)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    _task_file(tiny_model, gpu / "tasks.json", "meta_schedule", CUDA)
    written = library.stat().st_mtime_ns
    capsys.readouterr()
    assert main([*argv[:5], str(gpu), *argv[6:]]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith(
        "relay-tasks: error: --profile runs the library on this machine's CPU, which cannot run "
        "code for 'cuda"
    )
    assert library.stat().st_mtime_ns == written  # refused before building


def test_serve_registers_at_the_tracker_until_interrupted(monkeypatch, capsys) -> None:
    import relay_tasks.cli as cli
    import relay_tasks.rpc as rpc

    started: list[tuple] = []

    class Server:
        port = 9123
        stopped = False

        def terminate(self) -> None:
            Server.stopped = True

    def start_server(tracker, key, *, host, port):
        started.append((tracker, key, host, port))
        return Server()

    def interrupted(seconds: float) -> None:
        assert seconds > 0  # as time.sleep requires
        raise KeyboardInterrupt

    handlers: dict[int, object] = {}
    monkeypatch.setattr(rpc, "start_server", start_server)
    monkeypatch.setattr(cli.time, "sleep", interrupted)
    monkeypatch.setattr(
        cli.signal, "signal", lambda number, handler: handlers.update({number: handler})
    )
    assert main(["serve", "--tracker", "h:9190", "--key", "k", "--port", "9500"]) == 130
    assert started == [(("h", 9190), "k", "127.0.0.1", 9500)]
    assert Server.stopped
    assert capsys.readouterr().err == (
        "serving as 'k' at 127.0.0.1:9123 for tracker h:9190 (Ctrl-C stops)\n"
        "relay-tasks: interrupted\n"
    )
    import signal

    with pytest.raises(SystemExit) as caught:
        handlers[signal.SIGTERM](signal.SIGTERM, None)
    assert caught.value.code == 128 + signal.SIGTERM
    # A bad address is named in serve's own spelling of the options.
    assert main(["serve", "--tracker", "h", "--key", "k"]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "relay-tasks: error: cannot use RPC tracker 'h': give --tracker HOST:PORT and --key KEY\n"
    )


def test_the_command_reference_is_what_the_parser_prints() -> None:
    """``./dev docs`` writes it into docs/cli.md; an option, default or help line changed in the
    parser alone (or in the document alone) fails here until the reference is written again."""
    import importlib.util

    repo = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("cli_reference", repo / "tools/cli_reference.py")
    assert spec is not None and spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    written = reference.section((repo / "docs" / "cli.md").read_text())
    assert written, "docs/cli.md lost its command reference markers"
    assert written == reference.render(), "docs/cli.md's command reference is stale: ./dev docs"
    for verb in ("extract", "tune", "status", "compile", "serve"):
        assert f"usage: relay-tasks {verb} [-h]" in written


def _documents() -> dict[str, str]:
    """The README and every document in docs/, by name."""
    repo = Path(__file__).resolve().parent.parent
    paths = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
    return {path.name: path.read_text() for path in paths}


def test_the_docs_document_every_option_and_use_only_real_ones() -> None:
    """Every verb and option the parser has is written in the docs (by one of its spellings),
    and every command line any document shows parses (so an option renamed on one side shows
    here); the README's tour shows every verb."""
    import argparse
    import shlex

    documents = _documents()
    everything = "\n".join(documents.values())
    parser = build_parser()
    (verbs,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    written = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", everything))
    for verb, sub in verbs.choices.items():
        assert f"relay-tasks {verb}" in documents["README.md"], verb
        options = [
            a.option_strings for a in sub._actions if a.option_strings[:1] not in ([], ["-h"])
        ]
        missing = [o for o in options if not set(o) & written]
        assert missing == [], (verb, missing)
    for name, text in documents.items():
        commands = re.findall(r"^\./dev relay-tasks ((?:[^\n]*\\\n)*[^\n]*)", text, re.MULTILINE)
        assert name not in ("README.md", "models.md", "tuning.md") or len(commands) >= 4, name
        for command in commands:
            argv = shlex.split(command.replace("\\\n", " "), comments=True)
            parsed = parser.parse_args(argv)  # an unknown option or choice exits
            assert parsed.verb == argv[0], (name, command)


def test_the_docs_links_lead_somewhere() -> None:
    """Every relative link in the README and docs/ names a file that exists."""
    repo = Path(__file__).resolve().parent.parent
    for name, text in _documents().items():
        folder = repo if name == "README.md" else repo / "docs"
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (folder / target).exists(), (name, target)


def test_an_unexpected_failure_is_one_line_asking_for_a_report(monkeypatch, capsys) -> None:
    import relay_tasks.cli as cli

    def broken(_args):
        raise RuntimeError("first line\nsecond line\nthe last line says what\n")

    monkeypatch.setattr(cli, "_extract", broken)
    assert main(["extract"]) == cli.EXIT_INTERNAL == 70
    assert capsys.readouterr().err == (
        "relay-tasks: internal error: RuntimeError: the last line says what (please report this "
        "with the command you ran)\n"
    )

    def silent(_args):
        raise RuntimeError()

    monkeypatch.setattr(cli, "_extract", silent)
    assert main(["extract"]) == cli.EXIT_INTERNAL
    assert capsys.readouterr().err == (
        "relay-tasks: internal error: RuntimeError (please report this with the command you ran)\n"
    )


def test_warnings_are_one_line_each_ours_plain_others_by_category(monkeypatch, capsys) -> None:
    import warnings

    import relay_tasks.cli as cli
    from relay_tasks.errors import SkippedTaskWarning

    def warns(_args):
        warnings.warn("f has a dynamic shape", SkippedTaskWarning, stacklevel=1)
        warnings.warn("odd input", RuntimeWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(cli, "_extract", warns)
    assert main(["extract"]) == 0
    assert capsys.readouterr().err == (
        "relay-tasks: warning: f has a dynamic shape\nrelay-tasks: RuntimeWarning: odd input\n"
    )


def test_several_models_get_a_models_column_and_params_go_with_one_model(
    tiny_model, capsys
) -> None:
    text, params = tiny_model
    assert main(["extract", str(text), "resnet-18", "--target", X86, "--tuner", "autotvm"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[-2:] == ["op", "models"]
    used_by = [row.split()[-1] for row in rows]  # no task is shared: one model each
    assert used_by[:2] == [str(text)] * 2 and set(used_by[2:]) == {"resnet-18"}
    both = ["extract", str(text), str(text), "--params", str(params), "--target", X86]
    assert main(both) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "relay-tasks: error: --params names the weights of one Relay model; give one model with it\n"
    )


def test_a_tracker_without_the_device_is_one_tuning_error(monkeypatch) -> None:
    import relay_tasks.cli as cli
    from relay_tasks.errors import TuningError

    asked: list[tuple] = []

    class Tracker:
        def request(self, key, session_timeout):
            asked.append((key, session_timeout))
            raise RuntimeError("Traceback:\n  rpc/client.py, in request\nno free device rk3588")

    monkeypatch.setattr(tvm.rpc, "connect_tracker", lambda host, port: Tracker())
    with pytest.raises(TuningError) as raised:
        cli._remote(("10.0.0.1", 9190), "rk3588")
    assert asked == [("rk3588", 120)]
    assert str(raised.value) == (  # one line: the CLI prints it as is
        "no device 'rk3588' at tracker 10.0.0.1:9190: no free device rk3588"
    )


def test_on_a_terminal_extract_and_tune_say_what_they_did(
    tiny_model, tune_calls, tmp_path, monkeypatch
):
    """In this process, with stderr a (fake) terminal: the count and time of an extraction, and
    where a tune's records are; stdout keeps only the results."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    text, params = tiny_model
    shown = Terminal()
    monkeypatch.setattr(sys, "stderr", shown)
    assert main(["extract", str(text), "--params", str(params), "--target", X86]) == 0
    found = re.search(r"\r(relay-tasks: .*)\n$", shown.getvalue())  # after the progress bar
    assert found and re.fullmatch(EXTRACTED.format(tasks=1), found.group(1)), shown.getvalue()
    shown.truncate(0)
    shown.seek(0)
    work = tmp_path / "w"
    tune = ["tune", str(text), "--params", str(params), "--target", HOST, "--work-dir", str(work)]
    assert main(tune) == 0
    said = f"\rrecords in {work}; next: relay-tasks status / relay-tasks compile\n"
    assert shown.getvalue().endswith(said), shown.getvalue()


def test_the_table_shows_gflop_shares_and_the_models_of_each_task() -> None:
    from relay_tasks.adapters import TunerTask
    from relay_tasks.cli import format_table

    tasks = [
        TunerTask("conv", 2, "nn.conv2d", "k1", None, ("a.onnx", "b.onnx")),
        TunerTask("dense", 1, "nn.dense", "k2", None, ("b.onnx",)),
    ]
    # Shares of weight x GFLOP: 2 x 1.5 and 1 x 1 of 4.
    table = format_table(tasks, [1.5e9, 1e9], several=True)
    assert [row.split() for row in table.splitlines()] == [
        ["#", "task", "weight", "GFLOP", "share", "anchor", "op", "models"],
        ["0", "conv", "2", "1.5", "75.0%", "nn.conv2d", "a.onnx,b.onnx"],
        ["1", "dense", "1", "1", "25.0%", "nn.dense", "b.onnx"],
    ]
    # A model without work (layout changes only) has no shares to show.
    alone = format_table(tasks[1:], [0.0]).splitlines()[1]
    assert alone.split() == ["0", "dense", "1", "0", "-", "nn.dense"]


def test_a_stopped_tune_is_one_line_with_the_signals_exit_code(tiny_model, monkeypatch, capsys):
    import relay_tasks.tuning as tuning
    from relay_tasks.errors import TuningInterrupted

    def stopped(tasks, target, **options):
        raise TuningInterrupted("stopped; 3 valid measurements are kept in w", 15)

    monkeypatch.setattr(tuning, "tune", stopped)
    text, params = tiny_model
    argv = ["tune", str(text), "--params", str(params), "--target", X86, "--work-dir", "w"]
    assert main(argv) == 128 + 15
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        "relay-tasks: interrupted: stopped; 3 valid measurements are kept in w\n",
    )


def test_model_format_overrides_the_suffix(tiny_model, tmp_path, capsys) -> None:
    text, params = tiny_model
    odd = tmp_path / "tiny.model"
    odd.write_text(text.read_text())
    argv = ["extract", str(odd), "--params", str(params), "--target", X86]
    assert main(argv) != 0
    capsys.readouterr()
    assert main([*argv, "--model-format", "relay"]) == 0
    assert capsys.readouterr().out == TINY_TABLE


def test_version_names_the_package_and_its_tvm(capsys) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    expected = (
        f"relay-tasks {metadata.version('relay-tasks')} (hhb-tvm {metadata.version('hhb-tvm')})"
    )
    assert capsys.readouterr().out == expected + "\n"


def test_compile_checks_its_output_before_it_builds(tiny_model, tmp_path, capsys) -> None:
    """``-o`` into a missing folder failed after the whole build, quoting tar."""
    text, params = tiny_model
    argv = ["compile", str(text), "--params", str(params), "--work-dir", str(tmp_path / "w")]
    assert main([*argv, "-o", str(tmp_path / "missing" / "m.tar")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == (f"relay-tasks: error: -o {tmp_path / 'missing' / 'm.tar'}: there is no folder "
                   f"{tmp_path / 'missing'}; create it, or name another\n")  # fmt: skip
    assert not (tmp_path / "w").exists()  # refused before the work dir was even read
