"""Many models at once, task files, and the tune verb (local and through an RPC tracker)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relay

import relay_tasks
from relay_tasks.api import extract_models, tune
from relay_tasks.cli import main

from small_graphs import _module, _weights
from zoo import X86, load


def _block(seed: int, extra: bool) -> tuple[tvm.IRModule, dict]:
    """A model with a shared first layer; ``extra`` adds a layer only this model has."""
    rng = np.random.default_rng(seed)
    data = relay.var("data", shape=(1, 16, 14, 14))
    w = relay.var("w", shape=(16, 16, 3, 3))
    out = relay.nn.relu(relay.nn.conv2d(data, w, padding=(1, 1), channels=16, kernel_size=(3, 3)))
    shapes = {"w": (16, 16, 3, 3)}
    if extra:
        w2 = relay.var("w2", shape=(32, 16, 1, 1))
        out = relay.nn.conv2d(out, w2, channels=32, kernel_size=(1, 1))
        shapes["w2"] = (32, 16, 1, 1)
    return _module(out), _weights(rng, **shapes)


@pytest.mark.parametrize("tuner", ["meta_schedule", "autotvm", "ansor"])
def test_two_models_sharing_a_layer_give_one_task_with_summed_weight(tuner: str) -> None:
    a, b = _block(1, extra=False), _block(2, extra=True)
    single_a = relay_tasks.extract(*a[:1], X86, a[1], tuner=tuner)
    single_b = relay_tasks.extract(*b[:1], X86, b[1], tuner=tuner)
    merged = extract_models([("a", *a), ("b", *b)], X86, tuner=tuner)
    shared = {t.key for t in single_a} & {t.key for t in single_b}
    assert shared, "the models share no task; the test would prove nothing"
    assert [t.key for t in merged] == list(dict.fromkeys(t.key for t in single_a + single_b))
    weight_a = {t.key: t.weight for t in single_a}
    weight_b = {t.key: t.weight for t in single_b}
    for task in merged:
        assert task.weight == weight_a.get(task.key, 0) + weight_b.get(task.key, 0)
        assert task.models == tuple(
            m for m, w in (("a", weight_a), ("b", weight_b)) if task.key in w
        )
    if tuner == "meta_schedule":
        assert all(t.native.weight == t.weight for t in merged)


def _records(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_tune_writes_a_log_and_resumes(tmp_path: Path, capsys) -> None:
    data, w = relay.var("data", shape=(1, 32)), relay.var("w", shape=(16, 32))
    mod = tvm.IRModule.from_expr(relay.Function([data, w], relay.nn.relu(relay.nn.dense(data, w))))
    text, params = tmp_path / "m.relay", tmp_path / "m.params"
    text.write_text(mod.astext())
    params.write_bytes(relay.save_param_dict(_weights(np.random.default_rng(0), w=(16, 32))))
    target = str(relay_tasks.host_target())
    tasks_file = tmp_path / "tasks.json"
    assert (
        main(
            [
                "extract",
                str(text),
                "--params",
                str(params),
                "--target",
                target,
                "--tuner",
                "autotvm",
                "--format",
                "json",
                "-o",
                str(tasks_file),
            ]
        )
        == 0
    )
    assert len(json.loads(tasks_file.read_text())["tasks"]) == 2  # dense_nopack and dense_pack
    work = tmp_path / "work"
    argv = ["tune", str(tasks_file), "--tuner", "autotvm", "--work-dir", str(work)]
    assert main([*argv, "--trials", "2"]) == 0
    log = work / "autotvm.log"
    assert _records(log) == 2  # one trial per task
    assert main([*argv, "--trials", "2"]) == 0  # all logged already: nothing measured again
    assert _records(log) == 2
    assert main([*argv, "--trials", "4"]) == 0
    assert _records(log) == 4  # the rerun added only the missing trials
    assert "measurements logged" in capsys.readouterr().out


def test_ansor_tuning_writes_only_into_the_work_dir(tmp_path: Path, monkeypatch) -> None:
    cwd, work = tmp_path / "cwd", tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    mod, params = load("dense_softmax")
    tasks = relay_tasks.extract(mod, relay_tasks.host_target(), params, tuner="ansor")[:1]
    assert tune(tasks, relay_tasks.host_target(), tuner="ansor", trials=2, work_dir=work) == 2
    assert {p.name for p in work.iterdir()} >= {"ansor.json", "total_latency.tsv"}
    assert list(cwd.iterdir()) == []


def test_tune_through_an_rpc_tracker(tmp_path: Path) -> None:
    from tvm.rpc.tracker import Tracker

    from relay_tasks.rpc import start_server

    tracker = Tracker(host="127.0.0.1", port=9190, port_end=9290, silent=True)
    server = start_server(
        ("127.0.0.1", tracker.port), "relay-tasks-test", host="127.0.0.1", port=9300
    )
    try:
        mod, params = load("dense_softmax")
        tasks = relay_tasks.extract(mod, relay_tasks.host_target(), params, tuner="autotvm")[:1]
        logged = tune(
            tasks,
            relay_tasks.host_target(),
            tuner="autotvm",
            trials=2,
            work_dir=tmp_path,
            rpc_tracker=f"127.0.0.1:{tracker.port}",
            rpc_key="relay-tasks-test",
        )
        assert logged == 2
        lines = (tmp_path / "autotvm.log").read_text().splitlines()
        assert all(json.loads(line)["result"][1] == 0 for line in lines)  # no measurement error
    finally:
        server.terminate()
        tracker.terminate()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rpc-tracker", "localhost"], "give --rpc-tracker HOST:PORT and --rpc-key KEY"),
        (["--rpc-key", "k"], "--rpc-key needs --rpc-tracker HOST:PORT"),
        (["--trials", "0"], "trials must be at least 1"),
    ],
)
def test_tune_usage_errors(argv: list[str], message: str, capsys) -> None:
    code = main(["tune", "dense_softmax_does_not_exist", "--work-dir", "/tmp/x", *argv])
    assert code != 0
    err = capsys.readouterr().err
    assert err.startswith("relay-tasks: error: ") and "Traceback" not in err
