"""What a work dir's history costs: ``status`` and ``compile`` against TVM's own readers, at
growing numbers of records.

For each tuner, a real tune of the model (``relay-tasks tune``, ``--trials`` valid records) is
the seed. Its record lines are then repeated, each copy's latencies made slower by a seeded
factor in [1, 2) (so the best record of every task stays the tune's own and every build is the
same), with their failures' causes and times, up to each size. Per size, each command runs
in a process of its own, timed whole (Python's start and imports included), with its peak
resident memory (``wait4``):

- ``status`` twice (the first builds the index beside the records, the second reads it),
  ``compile``, ``tune --reuse`` of the work dir into a new one, and ``tune`` resumed for 2
  more valid measurements (``relay-tasks``, as a user runs them);
- TVM's reader of the same files, as its tutorials apply records: MetaSchedule's
  ``JSONDatabase`` (every workload and record read, then the best of each workload queried),
  AutoTVM's ``ApplyHistoryBest``, Ansor's ``ApplyHistoryBest`` (each reads the whole log and
  keeps the best per workload). TVM's readers trust the files; ours check every record.

    python bench/records.py                        # dcgan, every tuner, 10^2, 10^4, 10^5
    python bench/records.py --tuners autotvm ansor --sizes 1000000
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


#: Slower copies made of each seed record; the rest repeat them (a million JSON round trips of
#: a 5 KB MetaSchedule record would take longer than the commands timed).
VARIANTS = 64


def grow(seed: Path, work: Path, tuner: str, size: int) -> None:
    """``work``: the work dir ``seed`` with its records repeated (slower) up to ``size``,
    written as they are made (a million records do not fit in memory twice)."""
    from relay_tasks.adapters import get_adapter

    files = get_adapter(tuner).files
    shutil.copytree(seed, work)
    records = (seed / files.records).read_text().splitlines()
    times = (seed / files.times).read_text().splitlines() if files.times else []
    rng = random.Random(0)
    copies = [[json.dumps(_slower(tuner, json.loads(line), 1 + rng.random()),
                          separators=(",", ":")) for _ in range(VARIANTS)]
              for line in records]  # fmt: skip
    failed = [_failed(tuner, json.loads(line)) for line in records]
    cause = json.dumps({"error": "a failure of the seed tune, repeated"}) + "\n"
    with (
        (work / files.records).open("w") as out,
        (work / files.causes).open("w") as causes,
        (work / (files.times or "unused-times")).open("w") as stamps,
    ):
        for i in range(size):
            seed_line, rank = i % len(records), i // len(records)
            out.write((records[seed_line] if rank == 0 else copies[seed_line][rank % VARIANTS])
                      + "\n")  # fmt: skip
            if failed[seed_line]:
                causes.write(cause)
            if times:
                stamps.write(times[i % len(times)] + "\n")
    (work / "unused-times").unlink(missing_ok=True)


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


#: Records past which TVM's own reader is not timed, by tuner: MetaSchedule's JSONDatabase
#: replays every record in C++ at ~17 ms each (170 s at 10^4), and is linear.
TVM_UP_TO = {"meta_schedule": 10_000}
COLUMNS = ("index", "status", "compile", "reuse", "tune", "tvm")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="dcgan", help="a zoo name (default dcgan)")
    parser.add_argument("--tuners", nargs="+", choices=TUNERS, default=list(TUNERS))
    parser.add_argument("--sizes", nargs="+", type=int, default=[100, 10_000, 100_000])
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
            work, fresh = args.out / f"{tuner}-{size}", args.out / f"{tuner}-{size}-reuse"
            for folder in (work, fresh):
                shutil.rmtree(folder, ignore_errors=True)
            grow(seed, work, tuner, size)
            mb = sum(p.stat().st_size for p in work.iterdir() if p.is_file()) / 2**20
            row: dict[str, Any] = {"tuner": tuner, "records": size, "MB": mb}
            status = [*cli, "status", "--work-dir", str(work)]
            row["index"] = timed(status)  # the first look builds the index
            row["status"] = timed(status)
            row["compile"] = timed([*cli, "compile", args.model, "--work-dir", str(work),
                                    "-o", str(work / "model.so")])  # fmt: skip
            tune = [*cli, "tune", args.model, "--tuner", tuner]
            row["reuse"] = timed([*tune, "--trials", "1", "--work-dir", str(fresh),
                                  "--reuse", str(work)])  # fmt: skip
            valid = _valid(cli, work)
            row["tune"] = timed([*tune, "--trials", str(valid + 2), "--work-dir", str(work)])
            if size <= TVM_UP_TO.get(tuner, size):
                row["tvm"] = timed([sys.executable, __file__, "--tvm-reader", tuner, str(work)])
            rows.append(row)
            print(_line(row), flush=True)
            for folder in (work, fresh):
                shutil.rmtree(folder)
    print("\n| tuner | records | MB | first status (builds the index) | status | compile "
          "| tune --reuse | tune, 2 more | TVM's reader |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(_line(row))


def _valid(cli: list[str], work: Path) -> int:
    """The valid measurements in ``work``, as ``status --format json`` counts them."""
    out = subprocess.run([*cli, "status", "--work-dir", str(work), "--format", "json"],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return int(json.loads(out)["valid"])


def _line(row: dict[str, Any]) -> str:
    cells = [f"{row[k][0]:.2f} ({row[k][1]:.0f})" if k in row else "-" for k in COLUMNS]
    return f"| {row['tuner']} | {row['records']:,} | {row['MB']:.1f} | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tvm-reader"]:
        tvm_reader(sys.argv[2], sys.argv[3])
    else:
        main()
