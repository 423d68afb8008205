"""``./dev`` runs from any directory: model paths and ``-o`` are the caller's, not the repo's."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tuned_models import write_tiny
from zoo import X86

DEV = Path(__file__).resolve().parent.parent / "dev"


def test_dev_keeps_the_callers_directory(tmp_path: Path) -> None:
    text, params = write_tiny(tmp_path)
    command = [str(DEV), "relay-tasks", "extract", text.name, "--params", params.name,
               "--target", X86, "-o", "tasks.txt"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tasks.txt").read_text().splitlines()[1].split()[
        1
    ] == "fused_nn_dense_nn_relu"


def _module(path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_bench_commands_are_the_bench_s_options() -> None:
    """Every ``./dev bench`` line a document shows parses with the bench's own parser, and its
    models are bench models, built-in models or files (an option renamed on one side shows)."""
    import re
    import shlex
    import sys

    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo / "bench"))
    try:
        bench, tuning, versus, where = (
            _module(repo / "bench" / f"{name}.py")
            for name in ("extract", "tune", "versus", "where")
        )
        from models import BENCH_MODELS
    finally:
        sys.path.remove(str(repo / "bench"))
    from relay_tasks.loaders.zoo import MODELS

    documents = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
    commands = [
        line
        for path in documents
        for line in re.findall(r"^\./dev bench\b([^\n]*)", path.read_text(), re.MULTILINE)
    ]
    assert len(commands) >= 4
    for command in commands:
        words = shlex.split(command, comments=True)
        if words[:1] == ["--tune"]:  # bench/tune.py: its parser checks its models
            tuning.build_parser().parse_args(words[1:])
            continue
        if words[:1] == ["--versus"]:  # bench/versus.py: likewise
            versus.build_parser().parse_args(words[1:])
            continue
        if words[:1] == ["--where"]:  # bench/where.py: a model file and a library
            where.build_parser().parse_args(words[1:])
            continue
        args = bench.build_parser().parse_args(words)
        for model in args.models or bench.DEFAULT_MODELS:
            assert model in BENCH_MODELS or model in MODELS or "." in model, (command, model)


def test_every_tuning_bench_model_loads_as_relay_tasks_loads_it(tmp_path: Path) -> None:
    """The tuning bench hands each model to ``relay-tasks`` as arguments (a built-in name, or
    Relay text and params it wrote): each loads and has tasks (BERT-2's dotted weight names
    once made its Relay text unparsable)."""
    import relay_tasks

    repo = Path(__file__).resolve().parent.parent
    tuning = _module(repo / "bench" / "tune.py")
    made = tuning._models(tmp_path)
    assert set(made) == set(tuning.MODELS)
    for model, arguments in made.items():
        mod, params = tuning._load(arguments)
        assert relay_tasks.extract(mod, X86, params, tuner="meta_schedule"), model


@pytest.mark.parametrize("tuner", ["meta_schedule", "autotvm", "ansor"])
def test_the_tuning_bench_times_upstreams_default_of_every_task(tuner: str, tmp_path: Path) -> None:
    """Upstream's estimate starts from each task built as upstream's build gives it without
    records; a build that fails there leaves the task out, and with it every estimate of
    upstream's (MetaSchedule's ``compile_relay`` once failed on every task, a missing
    argument)."""
    import relay_tasks
    from relay_tasks.adapters import get_adapter

    repo = Path(__file__).resolve().parent.parent
    tuning = _module(repo / "bench" / "tune.py")
    text, weights = write_tiny(tmp_path)
    mod, params = relay_tasks.load_model(text, params=weights)
    target = relay_tasks.host_target()
    tasks = get_adapter(tuner).extract(mod, target, params)
    found = tuning._upstream_defaults(tuner, tasks, tmp_path / "defaults")
    assert set(found) == {t.alternatives_of for t in tasks}
    assert all(0 < seconds < 1 for seconds in found.values())


#: One operator as our library's graph holds it and as ONNX Runtime's profiler shows it
#: (shapes from ResNet-50, MobileNetV2 and BERT-12 builds of the bench).
SAME_OPERATOR = [
    (("fused_nn_contrib_conv2d_NCHWc_add_nn_relu_7",
      [[1, 16, 14, 14, 16], [16, 16, 3, 3, 16, 16], [1, 16, 1, 1, 16]], [1, 16, 14, 14, 16]),
     ("FusedConv", [[1, 256, 14, 14], [256, 256, 3, 3], [256]], [[1, 256, 14, 14]])),
    (("fused_nn_contrib_conv2d_winograd_without_weight_transform_add_nn_relu",
      [[1, 56, 56, 64], [6, 6, 2, 2, 32, 32], [1, 1, 1, 64]], [1, 56, 56, 64]),
     ("Conv", [[1, 64, 56, 56], [64, 64, 3, 3], [64]], [[1, 64, 56, 56]])),
    (("fused_nn_contrib_depthwise_conv2d_NCHWc_add_clip",
      [[1, 6, 112, 112, 16], [6, 1, 3, 3, 1, 16], [1, 6, 1, 1, 16]], [1, 6, 56, 56, 16]),
     ("Conv", [[1, 96, 112, 112], [96, 1, 3, 3], [96]], [[1, 96, 56, 56]])),
    (("fused_nn_dense_1", [[128, 768], [8, 12, 192, 4, 32]], [128, 3072]),
     ("MatMul", [[1, 128, 768]], [[1, 128, 3072]])),
    (("fused_nn_batch_matmul", [[12, 128, 64], [12, 4, 2, 64, 16]], [12, 128, 128]),
     ("MatMul", [[1, 12, 128, 64], [1, 12, 64, 128]], [[1, 12, 128, 128]])),
]  # fmt: skip


def test_where_pairs_an_operator_of_ours_with_onnx_runtime_s_by_what_it_computes() -> None:
    """bench/where.py reads our blocked and Winograd layouts back to ONNX Runtime's NCHW
    signatures; a stride-2 convolution or another depth is another operator."""
    where = _module(DEV.parent / "bench" / "where.py")
    for (function, inputs, output), (op, their_inputs, outputs) in SAME_OPERATOR:
        assert where.ours(function, inputs, output) == where.theirs(op, their_inputs, outputs)
    strided = where.theirs("Conv", [[1, 64, 56, 56], [128, 64, 3, 3]], [[1, 128, 28, 28]])
    assert where.ours(*SAME_OPERATOR[1][0]) != strided
    assert where.ours("fused_nn_dense_1", [[128, 3072], [8, 12, 192, 4, 32]], [128, 3072]) != (
        where.theirs(*SAME_OPERATOR[3][1])
    )


def test_where_adds_calls_up_by_operator_and_shows_what_pairs_with_nothing() -> None:
    where = _module(DEV.parent / "bench" / "where.py")
    conv = ("conv", 64, 64, 3, 56, 56, False)
    mine = [(conv, 2e-3), (conv, 1e-3), (("other", "fused_layout_transform"), 5e-4)]
    lines = where.table(mine, [(conv, 2e-3), (("other", "ReorderOutput"), 1e-5)]).splitlines()
    assert lines[1].split() == ["3.000", "2", "2.000", "1", "1.50", "conv", "64", "64", "3",
                                "56", "56", "False"]  # fmt: skip
    assert lines[2].split()[:5] == ["0.500", "1", "-", "-", "-"]
    assert lines[3].split()[:5] == ["-", "-", "0.010", "1", "-"]
    assert lines[-1] == ("paired: ours 3.000 ms, ONNX Runtime 2.000 ms (1.50x); all calls: "
                         "ours 3.500 ms, ONNX Runtime 2.010 ms (1.74x)")  # fmt: skip
