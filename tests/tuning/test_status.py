"""``relay-tasks status``: the table, the model estimate, and the plot."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from relay_tasks.cli import main
from relay_tasks.tuning.defaults import read_defaults

from tuned_models import TUNERS, raw_measurements


@pytest.mark.parametrize("tuner", TUNERS)
def test_status_of_a_work_dir(tuner: str, tuned: dict[str, Path], tiny, capsys) -> None:
    work = tuned[tuner]
    assert main(["status", "--work-dir", str(work)]) == 0
    lines = capsys.readouterr().out.splitlines()
    end = next(i for i, line in enumerate(lines) if " valid measurements" in line)
    header, rows, last = lines[0].split(), lines[1:end], lines[end]
    # Then the causes of each task's failures, if it has any.
    assert all(re.match(r"failed #\d+ \S+: \d+x \S", line) for line in lines[end + 1 :])
    assert header == ["#", "task", "weight", "GFLOP", "trials", "valid", "failed", "best", "ms",
                      "share", "default", "ms"]  # fmt: skip
    defaults = read_defaults(work)  # what the worker measured before tuning, per function
    groups = [
        t["group"] or t["key"] for t in json.loads((work / "tasks.json").read_text())["tasks"]
    ]
    assert [float(r.split()[-1]) for r in rows] == [
        pytest.approx(defaults[g] * 1e3, rel=1e-3) for g in groups
    ]
    raw = raw_measurements(work, tuner)
    assert sum(int(r.split()[5]) for r in rows) == sum(1 for _, s in raw if s is not None)
    assert sum(int(r.split()[4]) for r in rows) == len(raw)
    assert all(float(r.split()[3]) > 0 for r in rows)  # GFLOP of a dense is not zero
    # The estimate is the weighted sum of each task's best, as the log has them.
    best: dict[str, float] = {}
    for task, seconds in raw:
        if seconds is not None:
            best[task] = min(best.get(task, seconds), seconds)
    weights = [int(r.split()[2]) for r in rows]
    assert len(best) == len(rows)
    # Alternatives of one function (AutoTVM's dense_nopack and dense_pack) count once: the best.
    once: dict[str, float] = {}
    for group, weight, seconds in zip(groups, weights, best.values(), strict=True):
        fastest = weight * min(seconds, defaults[group])  # the build takes the faster
        once[group] = min(once.get(group, fastest), fastest)
    expected = sum(once.values()) * 1e3
    shown = float(re.search(r"estimated model latency ([0-9.e-]+) ms", last).group(1))
    assert shown == pytest.approx(expected, rel=1e-3, abs=1e-4)
    # Given the model, the same tasks come from extraction.
    text, params = tiny
    assert main(["status", str(text), "--params", str(params), "--work-dir", str(work)]) == 0
    assert capsys.readouterr().out.splitlines() == lines


def test_plot(tuned: dict[str, Path], tmp_path: Path) -> None:
    image = tmp_path / "progress.png"
    assert main(["status", "--work-dir", str(tuned["autotvm"]), "--plot", str(image)]) == 0
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 10_000


def test_status_of_a_folder_that_is_no_work_dir(tmp_path: Path, capsys) -> None:
    assert main(["status", "--work-dir", str(tmp_path)]) == 2
    assert "is not a relay-tasks work dir" in capsys.readouterr().err


@pytest.mark.parametrize("tuner", ["meta_schedule"])  # AutoTVM's and Ansor's: callbacks below
def test_the_causes_of_failures_are_kept_and_shown(tuner, tiny, tmp_path, capsys) -> None:
    """Every build outlives a 0.1 ms timeout: each failure's cause is in the work dir, and
    status shows the most common ones per task."""
    from tuned_models import tune_argv

    work = tmp_path / "w"
    assert main([*tune_argv(tiny, tuner, work, 2), "--timeout", "0.0001"]) == 7
    capsys.readouterr()
    assert main(["status", "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out.splitlines()
    (shown,) = [line for line in out if line.startswith("failed #0 ")]
    count, cause = re.fullmatch(r"failed #0 \S+: (\d+)x (.+?)(; .*)?", shown).group(1, 2)
    assert int(count) >= 1 and "unknown error" not in cause and "see tune.log" not in cause
    assert "timeout" in cause.lower() or "time" in cause.lower(), cause


def test_ansor_keeps_each_failures_cause_in_order(tuned, tmp_path) -> None:
    """Ansor's callback writes each record and the message of each failed one together; the
    reader pairs the n-th failed record with the n-th cause."""
    import shutil

    from tvm.auto_scheduler.measure import MeasureResult
    from tvm.auto_scheduler.measure_record import load_record_from_string

    from relay_tasks.adapters import ansor
    from relay_tasks.adapters.ansor.session import _Keep

    work = tmp_path / "w"
    shutil.copytree(tuned["ansor"], work)
    inp, _ = load_record_from_string((work / "ansor.json").read_text().splitlines()[0])
    failed = MeasureResult([], 7, "Traceback\nRuntimeError: boom", 0.1, 0)  # RUN_TIMEOUT
    fine = MeasureResult([1e-5], 0, "", 0.1, 0)
    counted: list[int] = []
    scheduler = SimpleNamespace(measured=lambda inputs, results: counted.append(len(results)))
    _Keep(work, scheduler).callback(None, [inp] * 3, [fine, failed, fine])
    assert counted == [3]
    measured = ansor.measurements(work)
    assert [m.error for m in measured[-3:]] == ["", "RUN_TIMEOUT: RuntimeError: boom", ""]
    # The real tune's own failures (states that fail to instantiate) have their causes too.
    assert all(": " in m.error and "unknown" not in m.error for m in measured if m.error)


def test_alternatives_of_one_function_count_once_in_every_estimate() -> None:
    """AutoTVM's dense_nopack and dense_pack are two ways of computing one dense: a build runs
    one of them, so the estimate takes the faster, and the slower shows as an alternative."""
    from relay_tasks.adapters import TunerTask
    from relay_tasks.adapters.base import Measurement
    from relay_tasks.tuning import standing
    from relay_tasks.tuning.records import latency_by_trial
    from relay_tasks.tuning.status import format_status

    nopack = TunerTask("dense_nopack.x86", 2, "nn.dense", "k1", None, group="f")
    pack = TunerTask("dense_pack.x86", 2, "nn.dense", "k2", None, group="f")
    relu = TunerTask("relu", 1, "nn.relu", "k3", None)
    tasks = [nopack, pack, relu]
    records = [Measurement("k1", 3e-3), Measurement("k3", 1e-3), Measurement("k2", 2e-3)]
    assert standing(tasks, records[:1]).untuned == [standing(tasks, records[:1]).tasks[2]]
    assert standing(tasks, records[:2]).latency == pytest.approx(2 * 3e-3 + 1e-3)
    now = standing(tasks, records)
    assert now.latency == pytest.approx(2 * 2e-3 + 1e-3)  # not 2 x 3 + 2 x 2 + 1
    assert [r.task.name for r in now.chosen] == ["dense_pack.x86", "relu"]
    shares = [line.split()[-1] for line in format_status(now, [1e9] * 3).splitlines()[1:4]]
    assert shares == ["(alt.)", "80.0%", "20.0%"]
    assert latency_by_trial(tasks, records) == [
        (2, pytest.approx(7e-3)),
        (3, pytest.approx(5e-3)),
    ]
    # The plot's bars: what the build takes, each task numbered as in the table; its baseline
    # the defaults throughout (the alternatives of one function share one default).
    from relay_tasks.tuning.status import shares, status_document, untuned_estimate

    timed = standing(tasks, records, {"f": 2.5e-3, "k3": 0.5e-3})
    assert shares(timed) == [
        ("#1 dense_pack.x86", pytest.approx(2 * 2e-3)),
        ("#2 relu (default)", pytest.approx(0.5e-3)),
    ]
    assert untuned_estimate(timed) == pytest.approx(2 * 2.5e-3 + 0.5e-3)
    assert untuned_estimate(now) is None  # no default measured
    # The table says what the plot says: dense_nopack (3 ms) is slower than the default (2.5)
    # but the build runs dense_pack (2 ms), so it is an alternative passed over, not "default".
    table = [line.split()[8] for line in format_status(timed, [1e9] * 3).splitlines()[1:4]]
    assert table == ["(alt.)", "88.9%", "(default)"]
    built = [t["built_with"] for t in status_document(timed, [1e9] * 3)["tasks"]]
    assert built == ["alternative", "records", "default"]


def test_default_schedules_count_where_they_beat_the_records() -> None:
    """A function whose default schedule is faster than its best record is built with the
    default: the estimate counts the default, the row says so; one not measured yet counts
    its default, so the estimate (and the curve) starts before every task is measured."""
    from relay_tasks.adapters import TunerTask
    from relay_tasks.adapters.base import Measurement
    from relay_tasks.tuning import standing
    from relay_tasks.tuning.records import latency_by_trial
    from relay_tasks.tuning.status import format_status

    tasks = [TunerTask("conv", 2, "nn.conv2d", "k1", None), TunerTask("relu", 1, "nn.relu", "k2", None),
             TunerTask("add", 1, "add", "k3", None)]  # fmt: skip
    records = [Measurement("k1", 5e-3), Measurement("k2", 1e-3)]
    defaults = {"k1": 4e-3, "k2": 2e-3, "k3": 1e-3}
    now = standing(tasks, records, defaults)
    assert now.latency == pytest.approx(2 * 4e-3 + 1e-3 + 1e-3)
    assert [r.task.name for r in now.chosen] == ["relu"]
    rows = [line.split() for line in format_status(now, [1e9] * 3).splitlines()[1:4]]
    assert [r[-1] for r in rows] == ["4", "2", "1"]  # the default ms column
    assert (rows[0][8], rows[1][8], rows[2][7]) == ("(default)", "10.0%", "-")
    assert "TVM's default schedule where it is faster" in format_status(now, [1e9] * 3)
    assert standing(tasks, records).latency is None  # without defaults: "add" is unmeasured
    assert latency_by_trial(tasks, records, defaults) == [
        (1, pytest.approx(2 * 4e-3 + 2e-3 + 1e-3)),
        (2, pytest.approx(2 * 4e-3 + 1e-3 + 1e-3)),
    ]


def test_a_record_the_build_timed_slower_than_the_default_counts_as_the_default() -> None:
    """AutoTVM times a ``conv2d_NCHWc`` without the layout transforms around it; ``compile``
    times the best record built alone as the default is, and builds the default where that
    is faster. Status then says what the build runs: ResNet-18's records beat 8 defaults as
    AutoTVM timed them, none of them once timed alike, and the table showed them as built."""
    from relay_tasks.adapters import TunerTask
    from relay_tasks.adapters.base import Measurement
    from relay_tasks.tuning import standing
    from relay_tasks.tuning.status import format_status, shares

    tasks = [TunerTask("conv", 2, "nn.conv2d", "k1", None), TunerTask("relu", 1, "nn.relu", "k2", None)]  # fmt: skip
    records = [Measurement("k1", 3e-3), Measurement("k2", 1e-3)]
    defaults = {"k1": 4e-3, "k2": 2e-3}
    alike = {("k1", 3e-3): 5e-3, ("k2", 1e-3): 1.5e-3}
    now = standing(tasks, records, defaults, alike)
    assert [r.task.name for r in now.chosen] == ["relu"]
    assert now.latency == pytest.approx(2 * 4e-3 + 1.5e-3)
    assert shares(now) == [("#0 conv (default)", pytest.approx(8e-3)),
                           ("#1 relu", pytest.approx(1.5e-3))]  # fmt: skip
    rows = [line.split() for line in format_status(now, [1e9] * 2).splitlines()[1:3]]
    assert (rows[0][7], rows[0][8], rows[1][8]) == ("3", "(default)", "15.8%")
    # A record timed alike for another best (the tune went on since) does not count.
    later = standing(tasks, [*records, Measurement("k1", 2e-3)], defaults, alike)
    assert [r.task.name for r in later.chosen] == ["conv", "relu"]


def test_the_curve_against_time_needs_every_measurements_time() -> None:
    from relay_tasks.adapters import TunerTask
    from relay_tasks.adapters.base import Measurement
    from relay_tasks.tuning.records import latency_by_time

    tasks = [TunerTask("a", 2, "nn.dense", "k1", None), TunerTask("b", 1, "nn.relu", "k2", None)]
    records = [Measurement("k1", 3e-3, at=100.0), Measurement("k2", 1e-3, at=160.0),
               Measurement("k1", 1e-3, at=400.0)]  # fmt: skip
    assert latency_by_time(tasks, records) == [(60.0, pytest.approx(7e-3)),
                                               (300.0, pytest.approx(3e-3))]  # fmt: skip
    assert latency_by_time(tasks, [*records, Measurement("k2", 2e-3)]) is None


@pytest.mark.parametrize("tuner", TUNERS)
def test_every_tuners_records_say_when_they_were_measured(tuner, tuned) -> None:
    """AutoTVM's and Ansor's records keep a time; MetaSchedule's are kept beside them (the
    oldest first without one, as a work dir from MetaSchedule's own writer has none)."""
    import shutil
    import time

    from relay_tasks.adapters import get_adapter

    measured = get_adapter(tuner).measurements(tuned[tuner])
    assert measured and all(time.time() - 86400 < m.at < time.time() for m in measured)
    if tuner == "meta_schedule":
        work = tuned[tuner].parent / "untimed"
        shutil.copytree(tuned[tuner], work, dirs_exist_ok=True)
        times = work / "meta_schedule_times.jsonl"
        times.write_text(times.read_text().splitlines(keepends=True)[-1])
        again = get_adapter(tuner).measurements(work)
        assert [m.at for m in again] == [None] * (len(measured) - 1) + [measured[-1].at]


def test_autotvm_alternatives_are_grouped_and_share_the_flops_once(tiny, capsys) -> None:
    text, params = tiny
    assert main(["extract", str(text), "--params", str(params), "--tuner", "autotvm"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert {row[1] for row in rows} == {"dense_nopack.x86", "dense_pack.x86"}
    shares = sorted(float(row[4].rstrip("%")) for row in rows)
    assert shares[-1] == 100.0 and shares[0] > 90  # each is (about) the whole dense, not half


def test_autotvm_keeps_each_failures_cause_in_order(tuned, tmp_path) -> None:
    """AutoTVM's result of a failure holds (traceback, error) where its costs would be; the
    callback writes it beside the records, which the reader pairs with the failed one."""
    from tvm.autotvm.measure import MeasureResult
    from tvm.autotvm.record import decode

    from relay_tasks.adapters import autotvm
    from relay_tasks.adapters.autotvm.database import ERRORS_FILE, keep_records
    from relay_tasks.adapters.index import _causes

    inp, _ = decode((tuned["autotvm"] / "autotvm.log").read_text().splitlines()[0])
    # As AutoTVM's LocalBuilder reports a build timeout: an exception with no message.
    failed = MeasureResult(("Traceback ...", TimeoutError()), 6, 10.0, 0)
    fine = MeasureResult((1e-5,), 0, 0.1, 0)
    keep_records(tmp_path)(None, [inp] * 3, [fine, failed, fine])
    causes = _causes(tmp_path / ERRORS_FILE)
    assert next(causes)[0] == "TimeoutError"
    assert next(causes)[0] == "unknown error"  # past the causes kept
    measured = autotvm.measurements(tmp_path)
    assert [m.error for m in measured] == ["", "BUILD_TIMEOUT: TimeoutError", ""]
    # An empty cause, as tune kept for timeouts before, reads as the error alone.
    (tmp_path / ERRORS_FILE).write_text('{"error": ""}\n')
    assert [m.error for m in autotvm.measurements(tmp_path)] == ["", "BUILD_TIMEOUT", ""]


@pytest.mark.parametrize("tuner", TUNERS)
def test_status_as_json_for_scripts(tuner: str, tuned: dict[str, Path], capsys) -> None:
    """``status --format json``: per task and in total what the table shows, checked against
    the tuner's raw log and the defaults measured before tuning, not against the table."""
    work = tuned[tuner]
    assert main(["status", "--work-dir", str(work), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    written = json.loads((work / "tasks.json").read_text())
    assert (document["tuner"], document["target"]) == (written["tuner"], written["target"])
    assert [t["key"] for t in document["tasks"]] == [t["key"] for t in written["tasks"]]
    raw = raw_measurements(work, tuner)
    assert document["valid"] == sum(1 for _, s in raw if s is not None)
    assert (
        sum(t["trials"] for t in document["tasks"])
        == len(raw)
        == document["valid"] + document["failed"]
    )
    best = sorted(
        min(s for t, s in raw if t == task and s is not None) for task in {t for t, _ in raw}
    )
    assert sorted(t["best_ms"] / 1e3 for t in document["tasks"]) == pytest.approx(best, rel=1e-6)
    defaults = read_defaults(work)
    for task, entry in zip(document["tasks"], written["tasks"], strict=True):
        default = defaults[entry["group"] or entry["key"]]
        assert task["alternatives_of"] == (entry["group"] or entry["key"])
        assert task["default_ms"] == pytest.approx(default * 1e3)
        assert task["built_with"] in ("records", "default", "alternative")
        if task["built_with"] == "records":
            assert task["best_ms"] < task["default_ms"]
    assert document["estimated_ms"] > 0 and document["not_measured"] == 0
