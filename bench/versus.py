"""What a user would run instead: our tuned build beside ONNX Runtime, PyTorch eager and TVM's
untuned build, after growing tuning budgets, all timed in one run, round by round.

Per model (built from torchvision or a Hugging Face config with seeded random weights, or
written here; nothing is downloaded): the PyTorch module is exported to ONNX once, and that
file is what every side runs. ``relay-tasks tune MODEL.onnx --time`` tunes for each budget
of wall time in turn (``--minutes 10 30 60``: 10, then 20 more, then 30 more, in one work dir),
and ``relay-tasks compile`` builds the library after each. Then one process times every
library, TVM's untuned build (TOPI's default schedules, opt_level 3), ONNX Runtime's CPU
provider on the same file (in the confined child that reads model files) and PyTorch eager
on the same weights, with ``relay_tasks.tuning.compile.compare``: 20 repeats of at least
50 ms each, taken in 5 rounds that time every side in turn, medians with the middle half.
Every runtime uses all the cores this process may use (TVM's builds through
relay-tasks' parallel launch: hhb-tvm's own runs every loop on one core, see
docs/how-it-works.md). Outputs of the tuned builds and of
PyTorch are checked against ONNX Runtime's. The machine's limit: the FP32 GFLOP/s of a
4096x4096 SGEMM in PyTorch's BLAS, measured in the same run; each row gives the model's
GFLOP/s (its tasks' FLOPs, as ``status`` counts them) and its share of that peak.

    python bench/versus.py --models resnet-18 --minutes 10 30 60     # what the issue asks
    python bench/versus.py --models dcgan --minutes 2 --tuner ansor  # a quick look

A table goes to stdout and docs-ready rows at the end; ``--plot FILE.png`` draws latency
against tuning minutes per model, the other runtimes as horizontal lines. Work dirs and
libraries stay in ``--out``: a later run with longer budgets resumes the tune.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from models import _first_output, _llama, _tokens, _torchvision  # bench/ is this script's path


def _bert(layers: int) -> Callable[[], tuple[Any, Any]]:
    def build() -> tuple[Any, Any]:
        import transformers

        config = transformers.BertConfig(num_hidden_layers=layers, torchscript=True)
        return transformers.BertModel(config), _tokens()

    return build


def _dcgan() -> tuple[Any, Any]:
    """DCGAN's generator as its paper and TVM's zoo have it: a 100-d code to a 64x64 image."""
    import torch
    from torch import nn

    def up(cin: int, cout: int, first: bool = False) -> list[Any]:
        conv = nn.ConvTranspose2d(cin, cout, 4, 1 if first else 2, 0 if first else 1, bias=False)
        return [conv, nn.BatchNorm2d(cout), nn.ReLU(True)]

    layers = [*up(100, 512, True), *up(512, 256), *up(256, 128), *up(128, 64),
              nn.ConvTranspose2d(64, 3, 4, 2, 1, bias=False), nn.Tanh()]  # fmt: skip
    return nn.Sequential(*layers), torch.randn(1, 100, 1, 1)


MODELS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "resnet-18": _torchvision("resnet18"),
    "resnet-50": _torchvision("resnet50"),
    "mobilenet-v2": _torchvision("mobilenet_v2"),
    "bert-2": _bert(2),
    "bert-12": _bert(12),
    "llama-2": lambda: _llama(2),
    "dcgan": _dcgan,
}


def _module(name: str) -> tuple[Any, Any]:
    """The model with its seeded weights (the same on every call) and an example input."""
    import torch

    torch.manual_seed(0)
    module, example = MODELS[name]()
    return _first_output(module.eval()), example


def exported(name: str, folder: Path) -> Path:
    """The model's ONNX file, exported once."""
    import torch

    path = folder / f"{name}.onnx"
    if not path.exists():
        module, example = _module(name)
        with torch.no_grad():
            torch.onnx.export(module, (example,), str(path), input_names=["input"],
                              opset_version=14)  # fmt: skip
    return path


class Eager:
    """PyTorch eager on the model's weights, timed as ONNX Runtime is (``compare``'s others)."""

    def __init__(self, model: str, inputs: dict[str, Any]) -> None:
        import torch

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.module, _ = _module(model)
        self.input = torch.from_numpy(inputs["input"])
        self.name = f"pytorch {torch.__version__}"

    def time(self, count: int, min_repeat_ms: int) -> list[float]:
        import torch

        with torch.no_grad():
            self.module(self.input)
            started = time.perf_counter()
            self.module(self.input)
            number = max(1, math.ceil(min_repeat_ms / 1e3 / (time.perf_counter() - started)))
            times = []
            for _ in range(count):
                started = time.perf_counter()
                for _ in range(number):
                    self.module(self.input)
                times.append((time.perf_counter() - started) / number)
        return times

    def outputs(self) -> list[Any]:
        import torch

        with torch.no_grad():
            return [self.module(self.input).numpy()]


def sgemm_peak(n: int = 4096) -> float:
    """GFLOP/s of the best of 5 ``n``-square FP32 matrix products in PyTorch's BLAS."""
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = math.inf
    for _ in range(5):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best / 1e9


def timed(model: str, onnx: Path, libraries: dict[str, Path]) -> dict[str, Any]:
    """Runs in a child: every side timed in the same rounds; medians, middle halves, and
    each side's largest difference from ONNX Runtime's outputs."""
    ours = "GOMP_SPINCOUNT" not in os.environ  # relay-tasks sets it for the tune's libgomp
    from relay_tasks import host_target, load_model  # first: TVM's loops then use every core

    import tvm  # isort: skip

    if ours:
        os.environ.pop("GOMP_SPINCOUNT", None)  # PyTorch's own libgomp reads it at import
    from relay_tasks.tuning.compile import build_untuned, compare, max_difference, random_inputs
    from relay_tasks.tuning.versus import OnnxRuntime

    mod, params = load_model(onnx)
    inputs = random_inputs(mod, params)
    if "input" in inputs and inputs["input"].dtype.kind == "i":
        inputs["input"] = inputs["input"] % 1000  # token ids inside the vocabulary
    names = ["untuned", *libraries]
    factories = [build_untuned(mod, params, host_target())]
    factories += [tvm.runtime.load_module(str(path)) for path in libraries.values()]
    ort = OnnxRuntime(onnx, inputs)
    runs = compare(factories, inputs, others=[ort, Eager(model, inputs)])
    reference = runs[len(factories)].outputs
    result = {}
    for name, run in zip([*names, "onnxruntime", "pytorch"], runs, strict=True):
        result[name] = {
            "ms": run.seconds * 1e3,
            "spread": [s * 1e3 for s in run.spread],
            "apart": max_difference(run.outputs, reference),
        }
    result["peak"] = sgemm_peak()
    return result


def _cli(arguments: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "relay_tasks.cli", *arguments], check=True)


def _gflop(work: Path, onnx: Path) -> float:
    """The model's GFLOP per run: its tasks' FLOPs times their weights, as ``status`` counts
    them, each function once (AutoTVM's alternative templates of one are one); the model as
    loaded, so that a Winograd build's rate counts the direct convolutions' FLOPs."""
    out = subprocess.run([sys.executable, "-m", "relay_tasks.cli", "status", str(onnx),
                          "--work-dir", str(work), "--format", "json"], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    functions: dict[str, float] = {}
    for task in json.loads(out)["tasks"]:
        functions.setdefault(task["alternatives_of"], task["weight"] * task["gflop"])
    return sum(functions.values())


def run_model(model: str, args: argparse.Namespace) -> dict[str, Any]:
    onnx = exported(model, args.out)
    flags = ["--winograd"] if args.winograd else []
    variant = "-".join([args.tuner, *(f[2:] for f in flags), *(["seeds"] if args.seeds else [])])
    seeds = [] if args.seeds or args.tuner != "meta_schedule" else ["--no-seeds"]
    work = args.out / f"{model}-{variant}"
    libraries: dict[str, Path] = {}
    spent = 0.0
    for minutes in sorted(args.minutes):
        library = args.out / f"{model}-{variant}-{minutes:g}min.so"
        if not library.exists():
            _cli(["tune", str(onnx), "--tuner", args.tuner, "--work-dir", str(work),
                  "--time", f"{(minutes - spent) * 60:.0f}", *flags, *seeds])  # fmt: skip
            started = time.monotonic()  # a MetaSchedule compile chooses in the model too
            _cli(["compile", str(onnx), "--work-dir", str(work), "-o", str(library), *flags])
            print(f"{model}: compile after {minutes:g} min took "
                  f"{time.monotonic() - started:.0f} s", file=sys.stderr)  # fmt: skip
        libraries[f"tuned {minutes:g} min"] = library
        spent = minutes
    with tempfile.NamedTemporaryFile(suffix=".json") as answer:
        command = [sys.executable, __file__, "--timed", model, str(onnx), answer.name,
                   json.dumps({k: str(v) for k, v in libraries.items()})]  # fmt: skip
        subprocess.run(command, check=True)
        result = json.loads(Path(answer.name).read_text())
    result["gflop"] = _gflop(work, onnx)
    return result


def _row(model: str, result: dict[str, Any], columns: list[str]) -> str:
    cells = []
    for name in columns:
        side = result[name]
        low, high = side["spread"]
        cells.append(f"{side['ms']:.4g} ({low:.4g}-{high:.4g})")
    best = min(result[c]["ms"] for c in columns if c.startswith("tuned"))
    rate = result["gflop"] / (best / 1e3)
    share = rate / result["peak"]
    return (f"| {model} | {result['gflop']:.3g} | " + " | ".join(cells)
            + f" | {rate:.0f} ({share:.0%} of {result['peak']:.0f}) |")  # fmt: skip


def _plot(path: Path, results: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for axis, (model, result) in zip(axes[0], results.items(), strict=True):
        tuned = sorted((float(k.split()[1]), v["ms"]) for k, v in result.items()
                       if k.startswith("tuned"))  # fmt: skip
        axis.plot([m for m, _ in tuned], [ms for _, ms in tuned], "o-", label="relay-tasks tuned")
        for name, style in (("untuned", ":"), ("onnxruntime", "--"), ("pytorch", "-.")):
            axis.axhline(result[name]["ms"], linestyle=style, color="grey", label=name)
        axis.set(title=model, xlabel="tuning minutes", ylabel="latency ms")
        axis.set_ylim(bottom=0)
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--minutes", nargs="+", type=float, default=[10, 30, 60])
    parser.add_argument("--tuner", default="meta_schedule",
                        choices=["meta_schedule", "autotvm", "ansor"])  # fmt: skip
    parser.add_argument(
        "--winograd",
        action="store_true",
        help="tune and compile with --winograd (MetaSchedule and Ansor)",
    )
    parser.add_argument(
        "--seeds",
        action="store_true",
        help="start MetaSchedule's tasks from the seeds shipped for this CPU family (made from "
        "these very models' tunes by ./dev seeds: without it the bench times search alone)",
    )
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "versus-bench")
    parser.add_argument("--plot", type=Path)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOPHUB_LOCATION", "NONE")
    results = {}
    for model in args.models:
        results[model] = run_model(model, args)
        print(json.dumps({model: results[model]}), flush=True)
    columns = ["onnxruntime", "pytorch", "untuned", *[f"tuned {m:g} min" for m in args.minutes]]
    print(f"\n| model | GFLOP | {' | '.join(columns)} | best tuned GFLOP/s (of SGEMM peak) |")
    print("|---|---|" + "---|" * len(columns) + "---|")
    for model, result in results.items():
        print(_row(model, result, columns))
    for model, result in results.items():
        apart = {k: f"{v['apart']:.3g}" for k, v in result.items() if isinstance(v, dict)}
        print(f"{model}: largest difference from ONNX Runtime's outputs: {apart}")
    if args.plot:
        _plot(args.plot, results)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--timed"]:
        model, onnx, answer, libraries = sys.argv[2:6]
        paths = {k: Path(v) for k, v in json.loads(libraries).items()}
        Path(answer).write_text(json.dumps(timed(model, Path(onnx), paths)))
    else:
        main()
