"""``relay-tasks status``: where tuning stands, per task and for the model, as a table or a plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..adapters import Adapter, TunerTask
from ..adapters.base import Measurement
from ..errors import DependencyError, UsageError
from ..table import aligned
from .records import Standing, TaskRecord, latency_by_time, latency_by_trial


def format_status(now: Standing, flops: Sequence[float]) -> str:
    """Per task: weight, GFLOP per call, trials, valid and failed measurements, best latency and
    the task's share of the estimated model latency (weight x best; "(alt.)" for an alternative
    implementation a faster one replaces, "(default)" where TVM's default schedule is faster and
    is what a build takes), its latency with the default schedule where the work dir has it,
    and the models it serves when there are several; then the estimate."""
    header = ["#", "task", "weight", "GFLOP", "trials", "valid", "failed", "best ms", "share"]
    several = len({m for r in now.tasks for m in r.task.models}) > 1
    defaults = any(r.default is not None for r in now.tasks)
    rows = [header + (["default ms"] if defaults else []) + (["models"] if several else [])]
    total = now.latency
    for index, (record, flop) in enumerate(zip(now.tasks, flops, strict=True)):
        best, default = record.best, record.default
        built_ms = record.as_built
        share = f"{record.task.weight * built_ms / total:.1%}" if total and built_ms else ""
        built = _built(now, record)
        if share and built != "records":
            share = "(default)" if built == "default" else "(alt.)"
        row = [str(index), record.task.name, str(record.task.weight), f"{flop / 1e9:.4g}",
               str(record.trials), str(record.valid), str(record.failed),
               f"{best * 1e3:.4g}" if best is not None else "-", share]  # fmt: skip
        if defaults:
            row.append(f"{default * 1e3:.4g}" if default is not None else "-")
        rows.append(row + ([",".join(record.task.models)] if several else []))
    lines = aligned(rows, left={1, len(rows[0]) - 1} if several else {1})
    lines.append(_summary(now))
    lines += _failures(now)
    return "\n".join(lines)


def _built(now: Standing, record: TaskRecord) -> str | None:
    """What a build runs for a measured task: its ``"records"``; an ``"alternative"`` of its
    function whose records are faster; or the ``"default"`` schedule, faster than every
    alternative's records (the rule the plot's bars follow). None when it has no valid one."""
    if record.best is None:
        return None
    chosen = now.chosen
    if any(r is record for r in chosen):
        return "records"
    group = record.task.alternatives_of
    return "alternative" if any(r.task.alternatives_of == group for r in chosen) else "default"


def status_document(now: Standing, flops: Sequence[float]) -> dict[str, Any]:
    """What :func:`format_status` shows, as JSON values for scripts: per task its numbers (times
    in milliseconds, None where not measured), which schedule a build takes for it (``"records"``,
    ``"default"``, ``"alternative"``, or None when nothing is measured), the key its tuner's
    alternative templates of one function share (its own where it has none: a model's FLOPs
    count each such group once), and every failure cause with its count; then the totals and
    the estimate."""
    tasks = []
    for index, (record, flop) in enumerate(zip(now.tasks, flops, strict=True)):
        best, default = record.best, record.default
        built = _built(now, record)
        tasks.append({
            "index": index, "name": record.task.name, "key": record.task.key,
            "weight": record.task.weight, "gflop": flop / 1e9, "trials": record.trials,
            "valid": record.valid, "failed": record.failed,
            "best_ms": None if best is None else best * 1e3,
            "default_ms": None if default is None else default * 1e3,
            "built_with": built, "alternatives_of": record.task.alternatives_of,
            "models": list(record.task.models),
            "causes": [[cause, count] for cause, count in record.causes],
        })  # fmt: skip
    latency = now.latency
    return {
        "tasks": tasks,
        "valid": now.valid,
        "failed": now.failed,
        "estimated_ms": None if latency is None else latency * 1e3,
        "not_measured": len(now.untuned),
    }


#: The causes ``status`` shows per task with failures, most common first.
SHOWN_CAUSES = 2


def _failures(now: Standing) -> list[str]:
    """Why each task's failed measurements failed, the most common causes first."""
    lines = []
    for index, record in enumerate(now.tasks):
        if record.causes:
            shown = "; ".join(f"{n}x {cause}" for cause, n in record.causes[:SHOWN_CAUSES])
            more = len(record.causes) - SHOWN_CAUSES
            lines.append(f"failed #{index} {record.task.name}: {shown}"
                         + (f"; and {more} other causes" if more > 0 else ""))  # fmt: skip
    return lines


def _summary(now: Standing) -> str:
    counts = f"{now.valid} valid measurements" + (f", {now.failed} failed" if now.failed else "")
    if now.latency is not None:
        how = "best records"
        if any(r.default is not None for r in now.tasks):
            how += "; TVM's default schedule where it is faster"
        return f"{counts}; estimated model latency {now.latency * 1e3:.4g} ms ({how})"
    return f"{counts}; {len(now.untuned)} of {len(now.tasks)} tasks not measured yet"


def task_flops(adapter: Adapter, tasks: Sequence[TunerTask]) -> list[float]:
    return [adapter.flops(task.native) for task in tasks]


def plot(
    path: str | Path,
    now: Standing,
    measurements: Sequence[Measurement],
    title: str = "",
) -> None:
    """Estimated model latency against tuning time (against measurements where the records
    keep no time) beside the untuned estimate, and each task's share of it as the build takes
    it (:func:`shares`), as an image titled ``title``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError as err:
        raise DependencyError("--plot needs matplotlib: pip install 'relay-tasks[plot]'") from err
    target = Path(path)
    if target.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UsageError(f"--plot {target}: name a .png, .svg or .pdf file")
    tasks = [record.task for record in now.tasks]
    defaults = {r.task.alternatives_of: r.default for r in now.tasks if r.default is not None}
    timed = latency_by_time(tasks, measurements, defaults)
    curve = timed if timed is not None else latency_by_trial(tasks, measurements, defaults)
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    minutes = 60.0 if timed is not None else 1.0
    if curve:
        left.step([c / minutes for c, _ in curve], [s * 1e3 for _, s in curve], where="post")
    else:
        left.text(0.5, 0.5, "not every task measured yet", ha="center", transform=left.transAxes)
    baseline = untuned_estimate(now)
    if baseline is not None:
        left.axhline(baseline * 1e3, color="gray", linestyle="--", label="TVM's default schedules")
        left.legend(loc="upper right", fontsize=8)
    across = "minutes since the first measurement" if timed is not None else "measurements"
    left.set(xlabel=across, ylabel="estimated model latency (ms)",
             title="best estimated latency")  # fmt: skip
    bars = shares(now)
    right.barh([n for n, _ in bars][::-1], [s * 1e3 for _, s in bars][::-1])
    right.set(xlabel="weight x latency the build takes (ms)", title="share of the model by task")
    right.tick_params(axis="y", labelsize=7)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    try:
        figure.savefig(target)
    except OSError as err:
        raise UsageError(f"--plot {target}: cannot write it ({err.strerror})") from err
    finally:
        pyplot.close(figure)


def shares(now: Standing) -> list[tuple[str, float]]:
    """Each task the build runs, named as the table numbers it (``#3 conv2d_NCHWc.x86``: tasks
    of one template share a name), with weight x the latency the build takes: its best record,
    or the default schedule where that is faster ("(default)")."""
    chosen = {id(r) for r in now.chosen}
    fastest: dict[str, TaskRecord] = {}
    for record in now.tasks:
        held = fastest.get(record.task.alternatives_of)
        if record.best is not None and (held is None or record.best < held.best):  # type: ignore[operator]
            fastest[record.task.alternatives_of] = record
    bars = []
    for index, record in enumerate(now.tasks):
        if fastest.get(record.task.alternatives_of) is not record:
            continue  # unmeasured, or a faster alternative of the function is built
        name = f"#{index} {record.task.name}"
        if id(record) in chosen:
            bars.append((name, record.task.weight * float(record.as_built)))  # type: ignore[arg-type]
        else:
            bars.append((f"{name} (default)", record.task.weight * float(record.default)))  # type: ignore[arg-type]
    return bars


def untuned_estimate(now: Standing) -> float | None:
    """The model's latency with TVM's default schedules throughout, where every function's
    default was measured: the line a tune starts from."""
    fastest: dict[str, float] = {}
    for record in now.tasks:
        if record.default is None:
            return None
        group = record.task.alternatives_of
        fastest[group] = record.task.weight * record.default
    return sum(fastest.values()) if fastest else None
