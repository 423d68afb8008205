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
        bench, tuning, versus = (
            _module(repo / "bench" / f"{name}.py") for name in ("extract", "tune", "versus")
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
