"""A work dir's MetaSchedule database, read and written here: TVM sees only what was derived here.

MetaSchedule's ``JSONDatabase`` reads each workload line of its files with TVM's object JSON
reader, which builds whatever nodes a file names. Here a workload line is only a structural
hash: the workload's module is the task this command derived, never the file's. Each record's
trace passes :mod:`..records`' allowlist, then MetaSchedule replays it on that module into an
in-memory database, which is all the tuner and the build see. New records go to the same two
files, one line each as it completes, in ``JSONDatabase``'s format (its readers still read them).

A record names its workload by line number, and other tunes may share the files: each commit
takes the work dir's lock (:mod:`..journal`), reads the workload lines appended since it last
looked, and only then numbers its own.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import tvm
from tvm import meta_schedule as ms
from tvm.ir import IRModule

from ...errors import describe_failure
from ...files import read_regular
from ..base import (
    Line,
    Measurement,
    RecordFiles,
    TunerTask,
    cause_lines,
    damaged,
    record_lines,
)
from ..index import SEED, best_records, history
from ..journal import locked, write_locked
from ..records import trace_problem

#: A record's JSON form with its index maps as objects (the Python ``as_json`` cannot hold them).
_AS_JSON = tvm.get_global_func("meta_schedule.TuningRecordAsJSON")


WORKLOADS = "database_workload.json"


RECORDS = "database_tuning_record.json"


#: The causes of failed measurements, one a line (a record keeps only its failure's 1e10 s).
ERRORS = "meta_schedule_errors.jsonl"


#: When each record was measured, a line each in the records' order (a record has no time).
TIMES = "meta_schedule_times.jsonl"


FILES = RecordFiles(RECORDS, ERRORS, TIMES, WORKLOADS)


def workload_key(mod: IRModule) -> str:
    """The structural hash a workload line starts with, as the task key (16 hex digits)."""
    return f"{int(tvm.ir.structural_hash(mod)) & (2**64 - 1):016x}"


def _line_key(path: Path, number: int, line: str) -> str:
    """The key of a workload line ``[structural hash, module]``; its module is never read."""
    try:
        return f"{int(json.loads(line)[0]) & (2**64 - 1):016x}"
    except (TypeError, ValueError, IndexError, KeyError) as err:
        raise damaged(path, number, f"{type(err).__name__}: {err}") from err


class Entry(NamedTuple):
    """One record line: where it is, its task's key, and its fields as plain JSON."""

    number: int
    key: str
    trace: Any
    run_secs: Any
    args_info: Any


def workload_keys(work_dir: Path) -> list[str]:
    """The key of each workload line, by line (a record names its workload by index)."""
    path = work_dir / WORKLOADS
    return [_line_key(path, number, line) for number, line in record_lines(path)]


def entries(work_dir: Path, lines: Iterable[Line]) -> Iterator[Entry]:
    """Each record line of ``lines`` whose trace passes :func:`.records.trace_problem`
    (anything else is one ``ModelError`` naming file and line).

    A record is ``[workload index, [trace, run_secs, target, args_info]]``; its target is never
    read (a work dir is tuned for one target).
    """
    records, keys = work_dir / RECORDS, workload_keys(work_dir)
    for number, _, _, value, _ in lines:
        try:
            index, (trace, run_secs, *rest) = value
            key = keys[index]
        except (TypeError, ValueError, IndexError) as err:
            raise damaged(records, number, f"{type(err).__name__}: {err}") from err
        problem = trace_problem(trace)
        if problem:
            raise damaged(records, number, problem)
        yield Entry(number, key, trace, run_secs, rest[1] if len(rest) > 1 else None)


def read(work_dir: Path, lines: Iterable[Line]) -> Iterator[Measurement]:
    """The measurement of each record line (:attr:`.base.Adapter.read`): MetaSchedule names no
    failure, and keeps no time in a record (:func:`read_times` has them)."""
    for entry in entries(work_dir, lines):
        run_secs = entry.run_secs
        try:
            seconds = sum(run_secs) / len(run_secs) if run_secs else None
        except (TypeError, ValueError, ZeroDivisionError) as err:
            raise damaged(work_dir / RECORDS, entry.number, f"{type(err).__name__}: {err}") from err
        failed = seconds is None or seconds >= 1e9  # MetaSchedule's mark of a failed run
        yield Measurement(entry.key, None if failed else float(seconds), "")  # type: ignore[arg-type]


def best_entries(work_dir: Path, keys: Iterable[str], keep: int) -> list[Entry]:
    """The ``keep`` fastest valid records of each task of ``keys``, in the files' order."""
    lines = [line for line, _ in best_records(read, FILES, work_dir, keys, keep)]
    return list(entries(work_dir, lines))


class WorkDatabase:
    """The records of ``modules`` (the tasks derived here) from a work dir, in memory.

    ``memory`` is the ``MemoryDatabase`` to hand MetaSchedule; :meth:`commit` adds a record to
    it and to the work dir's files. Records of other modules (other models sharing the dir)
    stay in the files, unread. Of each module's records only its ``keep`` fastest valid ones
    are replayed into memory: all a search seeds from or its cost model first learns, or a
    build tries, ever asks of it (replaying one costs milliseconds: a work dir of 1,000
    records took a build from 17 to 80 s when every one was replayed).
    """

    def __init__(self, work_dir: Path, modules: Sequence[IRModule], keep: int = SEED) -> None:
        self.work_dir = work_dir
        self.memory = ms.database.MemoryDatabase()
        self.modules = {workload_key(m): m for m in modules}
        self.lines: dict[str, int] = {}
        self.count = self.read_to = 0  # workload lines numbered, bytes of them read
        with locked(work_dir, shared=True):  # reading: a read-only work dir is fine
            self._number(self._filed_since())
        for entry in best_entries(work_dir, self.modules, keep):
            self._load(entry)

    def _number(self, keys: Sequence[str]) -> None:
        """Workload lines ``count`` on: the first line of a key is the one records point at."""
        for index, key in enumerate(keys, start=self.count):
            self.lines.setdefault(key, index)
        self.count += len(keys)

    def _filed_since(self) -> list[str]:
        """The keys of the workload lines written since the last look (called holding the
        lock: every line but one a dead writer cut is whole)."""
        path = self.work_dir / WORKLOADS
        data = read_regular(path, offset=self.read_to)
        if data is None:
            return []
        whole = data[: data.rfind(b"\n") + 1]
        self.read_to += len(whole)
        lines = whole.decode("utf-8", errors="replace").splitlines()
        return [_line_key(path, self.count + n, line) for n, line in enumerate(lines, start=1)]

    def _load(self, entry: Entry, source: Path | None = None) -> Any:
        """The record of ``entry`` (of ``source``'s records, else this work dir's), replayed
        on the module derived here, in memory."""
        workload = self.memory.commit_workload(self.modules[entry.key])
        try:
            plain = tvm.runtime.convert([entry.trace, entry.run_secs, None, entry.args_info])
            record = ms.database.TuningRecord.from_json(plain, workload)
        except (tvm.TVMError, ValueError, TypeError) as err:
            path = (source or self.work_dir) / RECORDS
            raise damaged(path, entry.number, describe_failure(err)) from err
        self.memory.commit_tuning_record(record)
        return record

    def adopt(self, source: Path) -> int:
        """Copy the fastest valid records of these modules (:data:`.index.SEED` a task) from
        another work dir's database (each checked as this one's are), leaving out those among
        this one's fastest; returns how many."""
        have = {_same(e) for e in best_entries(self.work_dir, self.modules, SEED)}
        copied = 0
        for entry in best_entries(source, self.modules, SEED):
            if _same(entry) not in have:
                self._file(self._load(entry, source), measured=False)
                have.add(_same(entry))
                copied += 1
        return copied

    def commit(self, record: Any, cause: str | None = None) -> None:
        """A measured record (and a failure's cause): into memory, and one line appended to
        the work dir's records (its workload's line first, unless some writer filed it)."""
        self.memory.commit_tuning_record(record)
        self._file(record, cause)

    def _file(self, record: Any, cause: str | None = None, *, measured: bool = True) -> None:
        """Append ``record`` (with its time, when measured now; a copied one has none)."""
        stamp = [_dumps({"t": time.time() if measured else None})]
        mod = record.workload.mod
        key = workload_key(mod)
        line = _dumps(_plain(_AS_JSON(record)))
        causes = cause_lines([cause] if cause is not None else [])
        with locked(self.work_dir):
            self._number(self._filed_since())
            if key not in self.lines:
                saved = tvm.ir.save_json(mod).encode()  # as a length-prefixed string, as TVM does
                text = base64.b64encode(struct.pack("<Q", len(saved)) + saved).decode()
                write_locked(self.work_dir, [(WORKLOADS, [_dumps([str(int(key, 16)), text])])])
                self._number(self._filed_since())  # the line just written, numbered as read
            record_line = f"[{self.lines[key]},{line}]"
            write_locked(
                self.work_dir, [(RECORDS, [record_line]), (ERRORS, causes), (TIMES, stamp)]
            )


def read_times(work_dir: Path, records: int) -> list[float | None]:
    """When each of ``records`` records was measured, in their order. Records of
    MetaSchedule's own writer (a work dir from before the times were kept) have none and come
    first, so the times are the last records'; a record copied from another work dir has
    none either."""
    times: list[float | None] = []
    for _, line in record_lines(work_dir / TIMES):
        stamp = json.loads(line)
        value = stamp.get("t") if isinstance(stamp, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            value = None
        times.append(value if value is None else float(value))
    untimed = max(0, records - len(times))
    return [None] * untimed + times[: records - untimed]


def _same(entry: Entry) -> str:
    """What makes two records one measurement: task, schedule and run times."""
    return _dumps([entry.key, entry.trace, entry.run_secs])


def trace_json(trace: Any, remove_postproc: bool = False) -> Any:
    """A schedule's trace as the plain JSON a record holds (index maps as object JSON text);
    ``remove_postproc``: its search's part only, as a seed ships it (:mod:`.seeds`)."""
    return _plain(trace.as_json(remove_postproc=remove_postproc))


def _plain(value: Any) -> Any:
    """A record's JSON form as Python values; an index map as the object JSON text MetaSchedule
    writes for it (checked by :func:`.records.trace_problem` when read back)."""
    if isinstance(value, tvm.tir.IndexMap):
        return tvm.ir.save_json(value)
    if isinstance(value, (tvm.tir.IntImm, tvm.tir.FloatImm)):
        return value.value
    if isinstance(value, (str, tvm.runtime.String)):
        return str(value)
    if isinstance(value, (list, tvm.ir.Array)):
        return [_plain(item) for item in value]
    if isinstance(value, (dict, tvm.ir.Map)):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def measurements(work_dir: Path) -> list[Measurement]:
    """The JSON database's records in commit order (its API sorts them by latency), each under
    its workload's structural hash, this adapter's task key, with the time it was measured;
    every trace checked (see :func:`.database.entries`) before anything lets MetaSchedule read
    the database."""
    if not (work_dir / RECORDS).exists():
        return []
    records = history(read, work_dir, FILES)
    times = read_times(work_dir, len(records))
    return [replace(m, at=at) for m, at in zip(records, times, strict=True)]


#: The JSON database (workloads, a task's TIR a line, and records pointing into them) and the
#: failures' causes.
LOGS = (WORKLOADS, RECORDS, ERRORS, TIMES)


def adopt(tasks: Sequence[TunerTask], source: Path, work_dir: Path) -> int:
    """Copy the valid records of ``tasks`` from another work dir's database."""
    return WorkDatabase(work_dir, [t.native.dispatched[0] for t in tasks]).adopt(source)
