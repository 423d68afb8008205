"""The seeds relay-tasks ships for this host's CPU family (``./dev seeds``): our own MetaSchedule
tunes of the bench's models, the schedules of each task's fastest records.

    python bench/seeds.py                        # each model 30 minutes (resumable), then the file
    python bench/seeds.py --minutes 60 --models resnet-50 bert-12
    python bench/seeds.py --from DIR [DIR ...] --note "how they were tuned"
                                                 # the file from work dirs tuned on this host

Each model is exported to ONNX as ``bench/versus.py`` exports it and tuned with ``relay-tasks tune
--time`` for ``--minutes`` of wall time, with ``--no-seeds`` (seeds come from search alone, never
from older seeds), the ResNets with ``--winograd`` as the bench runs them (their direct
convolutions are tasks too). The work dirs stay in ``--out``: a later run with more minutes
resumes them. Then every task of the work dirs gives its two fastest valid records' schedules
(:mod:`relay_tasks.tuning.seeds`), written to the family file of this host's target in
``relay_tasks/adapters/meta_schedule/seeds/`` with a line saying how they were made: the host's
CPU, the date, the models and minutes. A seed file holds no time and no module: a tune measures
every seed here before keeping it.
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
from relay_tasks.tuning.seeds import seeds_of

#: The models tuned, each with the flags its bench row has.
RECIPE = {
    "resnet-50": ["--winograd"],
    "resnet-18": ["--winograd"],
    "mobilenet-v2": [],
    "bert-12": [],  # BERT-2's tasks are all BERT-12's
    "llama-2": [],
    "dcgan": [],
}


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def tune_models(models: list[str], minutes: float, out: Path) -> list[Path]:
    """Each model tuned for ``minutes`` in a work dir of its own under ``out`` (resumed)."""
    work_dirs = []
    for model in models:
        onnx = exported(model, out)
        work = out / f"{model}-seeds"
        _cli(["tune", str(onnx), "--tuner", "meta_schedule", "--work-dir", str(work),
              "--time", f"{minutes * 60:.0f}", "--no-seeds", *RECIPE[model]])  # fmt: skip
        work_dirs.append(work)
    return work_dirs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(RECIPE), default=list(RECIPE))
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "seeds-bench")
    parser.add_argument("--from", dest="sources", nargs="+", type=Path, metavar="DIR",
                        help="write the file from these work dirs instead of tuning")  # fmt: skip
    parser.add_argument("--note", default="", help="how the --from work dirs were tuned")
    args = parser.parse_args()
    os.environ.setdefault("TOPHUB_LOCATION", "NONE")
    name = family(relay_tasks.host_target())
    if name is None:
        sys.exit("this host's CPU is of no family seeds are kept for (x86 with AVX2 or AVX-512, "
                 "aarch64)")  # fmt: skip
    if args.sources:
        work_dirs = args.sources
        made = f"work dirs {', '.join(d.name for d in work_dirs)}{args.note and '; '}{args.note}"
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        work_dirs = tune_models(args.models, args.minutes, args.out)
        made = f"{', '.join(args.models)}, {args.minutes:g} minutes each"
    seeds = seeds_of(work_dirs)
    path = SHIPPED / f"{name}.jsonl.gz"
    stamp = datetime.date.today().isoformat()
    write_seeds(path, name, f"bench/seeds.py on {_cpu()}, {stamp}: {made}", seeds)
    print(f"{len(seeds)} tasks' seeds in {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
