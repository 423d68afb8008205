"""Side-by-side benchmark: upstream's task extraction against relay-tasks, in one run.

Every measurement runs in a fresh process (so import costs, caches and peak RSS are per row), the
rows alternate upstream/ours, and the table reports medians over ``--repeat`` runs, the task
counts, whether the task lists are equal, and the ratio upstream/ours.

    python bench/extract.py                         # one row per model class, x86 and CUDA
    python bench/extract.py --models resnet-18 mobilenet vgg-16 --targets x86 --repeat 3
    python bench/extract.py --sweep --tuners meta_schedule --targets x86   # depths
    python bench/extract.py --models resnet18.pt --input-shapes 'input0:[1,3,224,224]'

A model is a built-in name, a bench model (``bench/models.py``: PyTorch and ONNX transformers
and CNNs, a ConstantOfShape graph, small models, and families traced to TorchScript files and
loaded as ``relay-tasks extract FILE.pt`` loads them; built once into ``--cache-dir``, which
needs the ``torch`` extra), or a model file (anything ``relay-tasks extract`` reads; loading is not
timed). ``--input-shapes`` applies to every file model, as in the CLI. Peak RSS is the
process's peak during the extraction (on Linux; elsewhere the whole process's), which counts
the loaded model but not the peak of loading it.

Each row also counts the LLVM builds each side made (and their seconds): upstream's
``FoldConstant`` compiles every constant call it evaluates. The default run ends with the
CLI's default job (``relay-tasks extract``, ResNet-50) timed as a whole process, and the part
of it that is importing ``relay_tasks.cli``; then ``relay-tasks extract`` of a traced Llama
file, beside ``import torch`` alone.

Upstream's AutoTVM and Ansor extraction cannot compile for CUDA on this TVM build (see
tests/cuda_schedules.py): their CUDA rows show upstream's (partial) result, marked unequal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TARGETS = {
    "x86": "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512",
    "cuda": "cuda -arch=sm_80",
}
TUNERS = ("meta_schedule", "autotvm", "ansor")


def _measure(side: str, tuner: str, model: str, target: str, shapes: str) -> dict[str, Any]:
    """Runs inside the worker process: one extraction, timed, summarised."""
    import resource

    import tvm

    import relay_tasks  # (importing it also sets the environment: no TopHub download)
    from relay_tasks.loaders import parse_shapes

    if model.endswith(".json"):
        from models import load_cached

        mod, params = load_cached(Path(model))
    else:
        given, dtypes = parse_shapes(shapes) if shapes else (None, None)
        mod, params = relay_tasks.load_model(model, shapes=given, dtypes=dtypes)
    tgt = tvm.target.Target(target)
    peak_from_here = _reset_peak_rss()
    builds: list[float] = []
    started = time.perf_counter()
    with _llvm_builds_timed(builds):
        rows = _extract(side, tuner, mod, tgt, params)
    seconds = time.perf_counter() - started
    peak = _peak_rss_kib() if peak_from_here else None
    return {
        "seconds": seconds,
        "rows": rows,
        "rss_mib": (peak or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024,
        "builds": len(builds),
        "build_seconds": sum(builds),
    }


@contextlib.contextmanager
def _llvm_builds_timed(builds: list[float]) -> Iterator[None]:
    """Each LLVM build made meanwhile (code generation; the JIT's load follows on first use),
    as its seconds: constant folding's evaluations, for the most part."""
    import tvm

    original = tvm.get_global_func("target.build.llvm")

    def timed(mod: Any, target: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(mod, target)
        finally:
            builds.append(time.perf_counter() - started)

    tvm.register_func("target.build.llvm", timed, override=True)
    try:
        yield
    finally:
        tvm.register_func("target.build.llvm", original, override=True)


def _reset_peak_rss() -> bool:
    """Start the peak-RSS count now (Linux: clear_refs 5), so loading the model, which can peak
    higher than extracting it, is left out; False where that is not possible."""
    import gc

    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss_kib() -> int | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def _extract(side: str, tuner: str, mod: Any, target: Any, params: Any) -> list[list[Any]]:
    import tvm

    if tuner == "meta_schedule":
        if side == "upstream":
            from tvm.meta_schedule.relay_integration import extract_tasks

            tasks = extract_tasks(mod, target, params)
        else:
            from relay_tasks.adapters.meta_schedule import extract_task_from_relay

            tasks = extract_task_from_relay(mod, target, params)
        return [
            [t.task_name, int(t.weight), [tvm.ir.structural_hash(m) for m in t.dispatched]]
            for t in tasks
        ]
    if tuner == "autotvm":
        if side == "upstream":
            from tvm import autotvm

            found = autotvm.task.extract_from_program(mod["main"], target=target, params=params)
        else:
            from relay_tasks.autotvm import extract_tasks as autotvm_tasks

            found = autotvm_tasks(mod, target, params)
        return [[t.name, repr(t.args)] for t in found]
    from tvm import auto_scheduler

    from relay_tasks.adapters.ansor import default_hardware_params

    hardware = default_hardware_params(target)
    if side == "upstream":
        searches, weights = auto_scheduler.extract_tasks(
            mod["main"], params, target, hardware_params=hardware
        )
    else:
        from relay_tasks.ansor import extract_tasks as ansor_tasks

        searches, weights = ansor_tasks(mod, target, params, hardware_params=hardware)
    return [[t.workload_key, t.desc, int(w)] for t, w in zip(searches, weights, strict=True)]


def _run_worker(side: str, tuner: str, model: str, target: str, shapes: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", side, tuner, model, target, shapes]
    # A fixed hash seed: Ansor joins task names from a set, whose order follows string hashes.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"error": tail[0]}
    return json.loads(done.stdout.strip().splitlines()[-1])


#: One row per model class by default.
DEFAULT_MODELS = [
    "resnet-50",
    "bert-base",
    "gpt2",
    "resnet-50-onnx",
    "bert-onnx",
    "constant-of-shape",
    "small",
    "single-op",
    "t5-encoder",
    "llama-decoder",
    "swin-tiny",
    "deeplabv3",
    "convnext-tiny",
    "efficientnet-b0",
]
#: Depth sweeps: a transformer family (BERT-base encoders) and a CNN family (ResNets).
SWEEP = [
    "bert-base-L1",
    "bert-base-L4",
    "bert-base",
    "bert-base-L24",
    "resnet-18",
    "resnet-34",
    "resnet-50",
    "resnet-101",
]


def build_parser() -> argparse.ArgumentParser:
    """The bench's options (the docs' bench commands are checked against them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=None, help="default: one per class")
    parser.add_argument(
        "--sweep", action="store_true", help="BERT-base at 1/4/12/24 layers, ResNet-18/34/50/101"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "relay-tasks-bench",
        help="where bench models are built once",
    )
    parser.add_argument("--targets", nargs="+", choices=list(TARGETS), default=["x86", "cuda"])
    parser.add_argument("--tuners", nargs="+", choices=TUNERS, default=list(TUNERS))
    parser.add_argument("--repeat", type=int, default=1, help="runs per side; medians reported")
    parser.add_argument("--input-shapes", default="", help="for model files, as in the CLI")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_measure(*args.worker)))
        return 0

    header = (
        f"{'tuner':<14}{'model':<22}{'target':<7}{'upstream s':>11}{'ours s':>9}{'ratio':>8}"
        f"{'tasks up/ours':>15}{'equal':>7}{'RSS MiB up/ours':>17}{'JIT builds (s) up/ours':>24}"
    )
    print(header)
    print("-" * len(header))
    models = (args.models or ([] if args.sweep else DEFAULT_MODELS)) + (SWEEP if args.sweep else [])
    sources = {name: _source(name, args.cache_dir) for name in models}
    for tuner in args.tuners:
        for name in models:
            for tname in args.targets:
                row = _row(tuner, sources[name], tname, args.repeat, args.input_shapes)
                print(f"{tuner:<14}{Path(name).name:<22}{tname:<7}{row}", flush=True)
    if not args.models and not args.sweep:
        print(_whole_process(args.repeat))
        print(_whole_process_of_a_file(args.cache_dir, args.repeat))
    return 0


def _whole_process(repeat: int) -> str:
    """The CLI's default job as a user runs it, and the part of it that is importing."""
    commands = {
        "job": [sys.executable, "-m", "relay_tasks.cli", "extract"],
        "import": [sys.executable, "-c", "import relay_tasks.cli"],
    }
    seconds = {
        name: statistics.median(_wall(cmd) for _ in range(repeat)) for name, cmd in commands.items()
    }
    return (
        f"\nrelay-tasks extract (resnet-50), whole process: {seconds['job']:.2f} s, "
        f"of which importing relay_tasks.cli {seconds['import']:.2f} s"
    )


def _whole_process_of_a_file(cache: Path, repeat: int) -> str:
    """``relay-tasks extract FILE.pt`` as a user runs it on a traced model, against what it
    cannot avoid: importing torch, and the library's extraction of the converted module (the
    goal: those two and 1 s). Medians of ``repeat`` runs each."""
    from models import traced_file

    path, shapes = traced_file("llama-decoder", cache)
    cmd = [sys.executable, "-m", "relay_tasks.cli", "extract", str(path), "--input-shapes", shapes]
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        line = done.stderr.strip().splitlines()[-1]
        found = re.search(r"tasks in ([\d.]+) s", line)
        runs.append((time.perf_counter() - started, float(found[1]) if found else math.nan, line))
    whole = statistics.median(run[0] for run in runs)
    extraction = statistics.median(run[1] for run in runs)
    torch = statistics.median(_wall([sys.executable, "-c", "import torch"]) for _ in range(repeat))
    return (
        f"relay-tasks extract {path.name}, whole process: {whole:.2f} s ({runs[-1][2]}); "
        f"import torch alone: {torch:.2f} s; goal (torch + extraction + 1 s): "
        f"{torch + extraction + 1:.2f} s"
    )


def _wall(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - started


def _source(name: str, cache: Path) -> str:
    """What a worker loads: a bench model's cached module, else the name itself."""
    from models import BENCH_MODELS, cached

    return str(cached(name, cache)) if name in BENCH_MODELS else name


def _row(tuner: str, model: str, tname: str, repeat: int, shapes: str) -> str:
    """The measured columns of one row."""
    runs: dict[str, list[dict[str, Any]]] = {"upstream": [], "ours": []}
    for _ in range(repeat):
        for side in runs:
            runs[side].append(_run_worker(side, tuner, model, TARGETS[tname], shapes))
    errors = [r["error"] for side in runs.values() for r in side if "error" in r]
    if errors:
        return f"  failed: {errors[0]}"
    up, ours = runs["upstream"], runs["ours"]
    t_up = statistics.median(r["seconds"] for r in up)
    t_ours = statistics.median(r["seconds"] for r in ours)
    equal = all(r["rows"] == up[0]["rows"] for r in up + ours)
    rss_up = max(r["rss_mib"] for r in up)
    rss_ours = max(r["rss_mib"] for r in ours)
    counts = f"{len(up[0]['rows'])}/{len(ours[0]['rows'])}"
    builds = "/".join(
        f"{side[0]['builds']} ({statistics.median(r['build_seconds'] for r in side):.2f})"
        for side in (up, ours)
    )
    return (
        f"{t_up:>11.2f}{t_ours:>9.2f}{t_up / t_ours:>7.1f}x"
        f"{counts:>15}{'yes' if equal else 'NO':>7}{f'{rss_up:.0f}/{rss_ours:.0f}':>17}"
        f"{builds:>24}"
    )


if __name__ == "__main__":
    sys.exit(main())
