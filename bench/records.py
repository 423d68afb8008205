"""What a work dir's history costs: ``status`` and ``compile`` against TVM's own readers, at
growing numbers of records.

For each tuner, a real tune of the model (``relay-tasks tune``, ``--trials`` valid records) is
the seed. Its record lines are then repeated, each copy's latencies made slower by a seeded
factor in [1, 2) (so the best record of every task stays the tune's own and every build is the
same), with their failures' causes and times, up to each size. Per size, each command runs
in a process of its own, timed whole (Python's start and imports included), with its peak
resident memory (``wait4``):

- ``status`` and ``compile`` (``relay-tasks``, as a user runs them);
- TVM's reader of the same files, as its tutorials apply records: MetaSchedule's
  ``JSONDatabase`` (every workload and record read, then the best of each workload queried),
  AutoTVM's ``ApplyHistoryBest``, Ansor's ``ApplyHistoryBest`` (each reads the whole log and
  keeps the best per workload). TVM's readers trust the files; ours check every record.

    python bench/records.py                                # dcgan, every tuner, 10^2 to 10^4
    python bench/records.py --tuners meta_schedule --sizes 100 10000 100000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TUNERS = ("meta_schedule", "autotvm", "ansor")


def _slower(tuner: str, record: Any, factor: float) -> Any:
    """A copy of ``record`` whose measured run times are ``factor`` times longer."""
    if tuner == "autotvm":
        if record["result"][1] == 0:
            record["result"][0] = [c * factor for c in record["result"][0]]
    elif tuner == "ansor":
        if record["r"][1] == 0:
            record["r"][0] = [c * factor for c in record["r"][0]]
    else:
        run_secs = record[1][1]
        if run_secs and sum(run_secs) / len(run_secs) < 1e9:
            record[1][1] = [s * factor for s in run_secs]
    return record


def grow(seed: Path, work: Path, tuner: str, size: int) -> None:
    """``work``: the work dir ``seed`` with its records repeated (slower) up to ``size``."""
    from relay_tasks.adapters import get_adapter

    files = get_adapter(tuner).files
    assert files is not None
    shutil.copytree(seed, work)
    records = (seed / files.records).read_text().splitlines()
    times = (seed / files.times).read_text().splitlines() if files.times else []
    rng = random.Random(0)
    lines, stamps = [], []
    for i in range(size):
        line = records[i % len(records)]
        if i >= len(records):
            line = json.dumps(_slower(tuner, json.loads(line), 1 + rng.random()),
                              separators=(",", ":"))  # fmt: skip
        lines.append(line)
        if times:
            stamps.append(times[i % len(times)])
    failures = sum(1 for line in lines if _failed(tuner, json.loads(line)))
    (work / files.records).write_text("\n".join(lines) + "\n")
    cause = json.dumps({"error": "a failure of the seed tune, repeated"}) + "\n"
    (work / files.causes).write_text(cause * failures)
    if files.times:
        (work / files.times).write_text("\n".join(stamps) + "\n")


def _failed(tuner: str, record: Any) -> bool:
    if tuner == "autotvm":
        return bool(record["result"][1])
    if tuner == "ansor":
        return bool(record["r"][1])
    run_secs = record[1][1]
    return not run_secs or sum(run_secs) / len(run_secs) >= 1e9


def timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident MB of ``command``, run to the end (it must succeed)."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    err = child.stderr.read().decode() if child.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command[:4])}...: {err.strip().splitlines()[-1:]}")
    return seconds, usage.ru_maxrss / 1024


def tvm_reader(tuner: str, work: str) -> None:
    """Runs in a child: TVM's own reader of the work dir's records, as its tutorials apply
    them."""
    folder = Path(work)
    if tuner == "meta_schedule":
        from tvm import meta_schedule as ms

        database = ms.database.JSONDatabase(
            path_workload=str(folder / "database_workload.json"),
            path_tuning_record=str(folder / "database_tuning_record.json"),
        )
        for record in database.get_all_tuning_records()[:1]:
            database.get_top_k(record.workload, 1)
    elif tuner == "autotvm":
        from tvm import autotvm

        autotvm.apply_history_best(str(folder / "autotvm.log"))
    else:
        from tvm import auto_scheduler

        auto_scheduler.ApplyHistoryBest(str(folder / "ansor.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="dcgan", help="a zoo name (default dcgan)")
    parser.add_argument("--tuners", nargs="+", choices=TUNERS, default=list(TUNERS))
    parser.add_argument("--sizes", nargs="+", type=int, default=[100, 1000, 10000])
    parser.add_argument("--trials", type=int, default=16, help="valid records of the seed tune")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "records-bench")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "relay_tasks.cli"]
    os.environ.setdefault("TOPHUB_LOCATION", "NONE")
    rows = []
    for tuner in args.tuners:
        seed = args.out / f"{tuner}-seed"
        if not seed.exists():
            subprocess.run([*cli, "tune", args.model, "--tuner", tuner, "--trials",
                            str(args.trials), "--work-dir", str(seed)], check=True)  # fmt: skip
        for size in args.sizes:
            work = args.out / f"{tuner}-{size}"
            shutil.rmtree(work, ignore_errors=True)
            grow(seed, work, tuner, size)
            mb = sum(p.stat().st_size for p in work.iterdir() if p.is_file()) / 2**20
            row = {"tuner": tuner, "records": size, "MB": mb}
            row["status"] = timed([*cli, "status", "--work-dir", str(work)])
            row["compile"] = timed([*cli, "compile", args.model, "--work-dir", str(work),
                                    "-o", str(work / "model.so")])  # fmt: skip
            row["tvm"] = timed([sys.executable, __file__, "--tvm-reader", tuner, str(work)])
            rows.append(row)
            print(_line(row), flush=True)
            shutil.rmtree(work)
    print("\n| tuner | records | MB | status s (MB) | compile s (MB) | TVM's reader s (MB) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(_line(row))


def _line(row: dict[str, Any]) -> str:
    cells = [f"{row[k][0]:.2f} ({row[k][1]:.0f})" for k in ("status", "compile", "tvm")]
    return f"| {row['tuner']} | {row['records']:,} | {row['MB']:.1f} | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tvm-reader"]:
        tvm_reader(sys.argv[2], sys.argv[3])
    else:
        main()
