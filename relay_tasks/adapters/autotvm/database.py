"""AutoTVM's records in a work dir: its log (a record a line, read through the allowlist
before AutoTVM decodes it) and the causes of its failed measurements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from tvm import autotvm
from tvm.autotvm.task.space import ConfigSpace

from ...errors import describe_failure
from ..base import (
    Line,
    Measurement,
    RecordFiles,
    cause_lines,
    damaged,
    failure_cause,
)
from ..index import SEED, best_records, history
from ..journal import append
from ..records import autotvm_problem
from .tasks import key

#: The records, one a line.
LOG = "autotvm.log"


#: The causes of failed measurements, one a line (AutoTVM's log keeps only an error code).
ERRORS_FILE = "autotvm_errors.jsonl"


FILES = RecordFiles(LOG, ERRORS_FILE)


def keep_records(work_dir: Path) -> Callable[[Any, Any, Any], None]:
    """An AutoTVM callback appending a batch's records and its failures' causes (a failed
    result's costs hold the traceback and the error) together, for the work dir's other
    writers (AutoTVM's ``log_to_file`` writes through a buffer that can cut a line in two)."""

    def keep(tuner: Any, inputs: Any, results: Any) -> None:
        records = [
            autotvm.record.encode(inp, res) for inp, res in zip(inputs, results, strict=True)
        ]
        causes = [failure_cause(_report(res.costs[-1]) if res.costs else "")
                  for res in results if res.error_no != 0]  # fmt: skip
        append(work_dir, [(LOG, records), (ERRORS_FILE, cause_lines(causes))])

    return keep


def _report(cost: Any) -> str:
    """A failed result's report as lines: a failed build's is a (traceback, error) pair, whose
    ``str`` is one line of escaped newlines ending in the error; an error with no message (the
    builder's ``TimeoutError()``) is told by its type."""
    if isinstance(cost, tuple):
        return "\n".join(map(_report, cost))
    return str(cost) or (type(cost).__name__ if isinstance(cost, BaseException) else "")


def check_configs(natives: Sequence[autotvm.task.Task], work_dir: Path) -> None:
    """A record of one of ``natives`` that a build or a tune may apply (its fastest,
    :data:`.index.SEED` a task) may only choose values its config space holds: AutoTVM
    applies a record's knobs as written, and a value no search draws (a split that does not
    divide, an unroll of millions) gives schedules nobody meant to build. Records of other
    tasks (other models sharing the work dir) are never applied to these."""
    spaces = {key(n): n.config_space for n in natives}
    for line, m in best_records(read, FILES, work_dir, spaces, SEED):
        problem = outside(line.value["config"]["entity"], spaces[m.key])
        if problem:
            raise damaged(work_dir / LOG, line.number, problem)


#: The attribute of a knob's entities that a record's value stands for, by knob kind.
KNOB_VALUE = {"sp": "size", "re": "perm", "an": "anns", "ot": "val"}


def outside(knobs: list[list[Any]], space: ConfigSpace) -> str | None:
    """Why a record's knobs (``[name, kind, value]``) are not a point of ``space``, or None."""
    names = [k[0] for k in knobs]
    if not all(isinstance(n, str) for n in names) or sorted(names) != sorted(space.space_map):
        return "its knobs are not those of its task's config space"
    for name, kind, value in knobs:
        field = KNOB_VALUE[kind]
        if all(getattr(e, field, None) != value for e in space.space_map[name].entities):
            return f"its knob {name!r} = {str(value)[:60]} is outside its task's config space"
    return None


def read(work_dir: Path, lines: Iterable[Line]) -> Iterator[Measurement]:
    for r in log_records(work_dir / LOG, lines):
        yield Measurement(r.key, r.seconds, r.error, r.at)


def measurements(work_dir: Path) -> list[Measurement]:
    return history(read, work_dir, FILES)


class _Record(NamedTuple):
    """A record of the log, read through the allowlist (:func:`.records.autotvm_problem`)."""

    key: str
    inp: Any
    res: Any
    #: ``[name, kind, value]`` a knob, as the line spells them.
    knobs: list[list[Any]]
    #: The mean of its runs, None for a failed measurement, and then its error's name.
    seconds: float | None
    error: str
    at: float


def log_records(log: Path, lines: Iterable[Line]) -> Iterator[_Record]:
    """The records of ``log`` on ``lines``, each checked before AutoTVM decodes it: a line
    that is not one AutoTVM writes is damage (one ``ModelError`` naming the file and the
    line)."""
    for number, _, line, record, _ in lines:
        problem = autotvm_problem(record, autotvm.task.task.TASK_TABLE)
        if problem:
            raise damaged(log, number, problem)
        try:
            inp, res = autotvm.record.decode(line)
            task_key = key(inp.task)
            seconds = sum(res.costs) / len(res.costs) if res.error_no == 0 else None
            error = "" if res.error_no == 0 else autotvm.measure.MeasureErrorNo(res.error_no).name
            at = float(res.timestamp)
        except Exception as err:  # AutoTVM's decoder raises what the line's fields make it raise
            raise damaged(log, number, describe_failure(err)) from err
        yield _Record(task_key, inp, res, record["config"]["entity"], seconds, error, at)
