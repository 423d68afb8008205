"""Ansor's records in a work dir: its log (a record a line, read through the allowlist before
Ansor decodes it) and the causes of its failed measurements.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from tvm import auto_scheduler

from ...errors import (
    describe_failure,
)
from ..base import (
    Line,
    Measurement,
    RecordFiles,
    damaged,
)
from ..index import (
    history,
)
from ..records import ansor_problem
from .tasks import key

#: The records, one a line.
LOG = "ansor.json"


#: The causes of failed measurements, one a line (Ansor's log keeps only an error code).
ERRORS_FILE = "ansor_errors.jsonl"


FILES = RecordFiles(LOG, ERRORS_FILE)


def measure_failed(result: Any) -> bool:
    return int(result.error_no) != 0 or not list(result.costs)


def read(work_dir: Path, lines: Iterable[Line]) -> Iterator[Measurement]:
    codes = {int(v): k for k, v in vars(auto_scheduler.measure.MeasureErrorNo).items()
             if isinstance(v, int)}  # fmt: skip
    for record in log_records(work_dir / LOG, lines):
        failed = record.seconds is None
        name = codes.get(record.error_no, f"error {record.error_no}") if failed else ""
        yield Measurement(record.key, record.seconds, name, record.at)


def measurements(work_dir: Path) -> list[Measurement]:
    return history(read, work_dir, FILES)


class _Record(NamedTuple):
    """One line of an Ansor log as read here: its task key, mean latency (None if it failed)
    and when; ``inp`` and ``res`` are Ansor's own reading of it."""

    key: str
    seconds: float | None
    error_no: int
    at: float
    inp: Any
    res: Any


def log_records(log: Path, lines: Iterable[Line]) -> Iterator[_Record]:
    """The records of ``log``, each checked against the allowlist of steps before Ansor's
    reader sees it (:func:`.records.ansor_problem`); one that is not a record is one error
    naming the file and the line."""
    for number, _, line, value, _ in lines:
        try:
            task, (_, steps) = value["i"]  # {"i": [task, [stages, steps]], "r": ...}
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise damaged(log, number, f"not an Ansor record ({type(err).__name__})") from err
        problem = ansor_problem(task, steps)
        if problem:
            raise damaged(log, number, problem)
        try:
            inp, res = auto_scheduler.measure_record.load_record_from_string(line)
            task_key = key(inp.task)
            costs = [float(c) for c in res.costs]
            error_no = int(res.error_no)
        except Exception as err:  # TVM's record reader raises TVMError on what it cannot read
            raise damaged(log, number, describe_failure(err)) from err
        seconds = sum(costs) / len(costs) if error_no == 0 and costs else None
        yield _Record(task_key, seconds, error_no, float(res.timestamp), inp, res)
