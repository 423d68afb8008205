"""The seeds relay-tasks ships for a CPU family (``./dev seeds``): our own MetaSchedule
tunes of the bench's models, the schedules of each task's fastest records.

    python bench/seeds.py                        # each model 30 minutes (resumable), then the file
    python bench/seeds.py --minutes 60 --models resnet-50 bert-12
    python bench/seeds.py --target "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"
                                                 # another family this host's CPU runs (AVX2)
    python bench/seeds.py --from DIR [DIR ...] --note "how they were tuned"
                                                 # the file from work dirs tuned on this host

Each model is exported to ONNX as ``bench/versus.py`` exports it and tuned with ``relay-tasks tune
--time`` for ``--minutes`` of wall time, with ``--no-seeds`` (seeds come from search alone, never
from older seeds), the ResNets with ``--winograd`` as the bench runs them and ResNet-18 once more
without (:data:`RECIPE`). The work dirs stay in ``--out``: a later run with more minutes
resumes them. Then every task of the work dirs gives its two fastest valid records' schedules
(:mod:`relay_tasks.tuning.seeds`), written to the family file of the target in
``relay_tasks/adapters/meta_schedule/seeds/`` with a line saying how they were made: the
target, the host's CPU, the date, the models and minutes. The target is this host's unless
``--target`` names another this host runs: an AVX-512 host makes the ``x86-avx2`` file by tuning
for an AVX2 CPU (its schedules then use only AVX2, timed on this host's caches). A seed file
holds no time and no module: a tune measures every seed here before keeping it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

from versus import _cli, exported  # bench/ is this script's path

import relay_tasks
from relay_tasks.adapters.meta_schedule.seeds import SHIPPED, family, write_seeds
from relay_tasks.errors import RelayTasksError
from relay_tasks.inputs import as_target
from relay_tasks.tuning.seeds import seeds_of

#: The models tuned, each with the flags it is tuned with: the ResNets with ``--winograd`` as
#: their bench rows run, and ResNet-18 once more without, for a user who tunes a ResNet's 3x3
#: convolutions direct (ResNet-50's are ResNet-18's stride-1 ones).
RECIPE = [
    ("resnet-50", ["--winograd"]),
    ("resnet-18", ["--winograd"]),
    ("resnet-18", []),
    ("mobilenet-v2", []),
    ("bert-12", []),  # BERT-2's tasks are all BERT-12's
    ("llama-2", []),
    ("dcgan", []),
]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def tune_models(models: list[str], minutes: float, out: Path, target: str) -> list[Path]:
    """Each model tuned for ``minutes`` for ``target`` in a work dir of its own under ``out``
    (resumed)."""
    work_dirs = []
    for model, flags in RECIPE:
        if model not in models:
            continue
        onnx = exported(model, out)
        name = "-".join([model, *(flag.strip("-") for flag in flags)])
        work = out / f"{name}-{family(as_target(target))}-seeds"
        _cli(["tune", str(onnx), "--tuner", "meta_schedule", "--work-dir", str(work), "--target",
              target, "--time", f"{minutes * 60:.0f}", "--no-seeds", *flags])  # fmt: skip
        work_dirs.append(work)
    return work_dirs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    names = list(dict.fromkeys(model for model, _ in RECIPE))
    parser.add_argument("--models", nargs="+", choices=names, default=names)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "seeds-bench")
    parser.add_argument("--from", dest="sources", nargs="+", type=Path, metavar="DIR",
                        help="write the file from these work dirs instead of tuning")  # fmt: skip
    parser.add_argument("--note", default="", help="how the --from work dirs were tuned")
    parser.add_argument("--target", help="the family's target (default: this host's CPU)")
    args = parser.parse_args()
    os.environ.setdefault("TOPHUB_LOCATION", "NONE")
    try:
        target = as_target(args.target) if args.target else relay_tasks.host_target()
    except RelayTasksError as err:
        sys.exit(f"seeds: {err}")
    name = family(target)
    if name is None:
        sys.exit(f"'{target}' is of no CPU family seeds are kept for (x86 with AVX2 or "
                 "AVX-512, aarch64)")  # fmt: skip
    if args.sources:
        work_dirs = args.sources
        made = f"work dirs {', '.join(d.name for d in work_dirs)}{args.note and '; '}{args.note}"
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        work_dirs = tune_models(args.models, args.minutes, args.out, str(target))
        made = f"work dirs {', '.join(d.name for d in work_dirs)}, {args.minutes:g} minutes each"
    try:
        seeds = seeds_of(work_dirs, name)
    except RelayTasksError as err:
        sys.exit(f"seeds: {err}")
    path = SHIPPED / f"{name}.jsonl.gz"
    stamp = datetime.date.today().isoformat()
    write_seeds(path, name, f"bench/seeds.py for '{target}' on {_cpu()}, {stamp}: {made}", seeds)
    print(f"{len(seeds)} tasks' seeds in {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
