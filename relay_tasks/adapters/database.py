"""A work dir's MetaSchedule database, read and written here: TVM sees only what was derived here.

MetaSchedule's ``JSONDatabase`` reads each workload line of its files with TVM's object JSON
reader, which builds whatever nodes a file names. Here a workload line is only a structural
hash: the workload's module is the task this command derived, never the file's. Each record's
trace passes :mod:`.records`' allowlist, then MetaSchedule replays it on that module into an
in-memory database, which is all the tuner and the build see. New records go to the same two
files, one line each as it completes, in ``JSONDatabase``'s format (its readers still read them).

A record names its workload by line number, and other tunes may share the files: each commit
takes the work dir's lock (:mod:`.journal`), reads the workload lines appended since it last
looked, and only then numbers its own.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import tvm
from tvm import meta_schedule as ms
from tvm.ir import IRModule

from ..errors import describe_failure
from ..files import read_regular
from .base import cause_lines, damaged, fastest, record_lines, record_values
from .journal import locked, write_locked
from .records import trace_problem

#: A record's JSON form with its index maps as objects (the Python ``as_json`` cannot hold them).
_AS_JSON = tvm.get_global_func("meta_schedule.TuningRecordAsJSON")
WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
#: The causes of failed measurements, one a line (a record keeps only its failure's 1e10 s).
ERRORS = "meta_schedule_errors.jsonl"
#: When each record was measured, a line each in the records' order (a record has no time).
TIMES = "meta_schedule_times.jsonl"
#: Valid records of each task replayed into memory by default: the most any reader asks for
#: (a tune's cost model learns from its 256 fastest at most; a search seeds from fewer).
KEEP = 256


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


def read_records(work_dir: Path) -> tuple[list[str], list[Entry]]:
    """The key of each workload line, and each record line whose trace passes
    :func:`.records.trace_problem` (anything else is one ``ModelError`` naming file and line).

    A record is ``[workload index, [trace, run_secs, target, args_info]]``; its target is never
    read (a work dir is tuned for one target).
    """
    workloads, records = work_dir / WORKLOADS, work_dir / RECORDS
    keys = [_line_key(workloads, number, line) for number, line in record_lines(workloads)]
    entries = []
    for number, _, value in record_values(records):
        try:
            index, (trace, run_secs, *rest) = value
            key = keys[index]
        except (TypeError, ValueError, IndexError) as err:
            raise damaged(records, number, f"{type(err).__name__}: {err}") from err
        problem = trace_problem(trace)
        if problem:
            raise damaged(records, number, problem)
        entries.append(Entry(number, key, trace, run_secs, rest[1] if len(rest) > 1 else None))
    return keys, entries


class WorkDatabase:
    """The records of ``modules`` (the tasks derived here) from a work dir, in memory.

    ``memory`` is the ``MemoryDatabase`` to hand MetaSchedule; :meth:`commit` adds a record to
    it and to the work dir's files. Records of other modules (other models sharing the dir)
    stay in the files, unread. Of each module's records only its ``keep`` fastest valid ones
    are replayed into memory: all a search seeds from or its cost model first learns, or a
    build tries, ever asks of it (replaying one costs milliseconds: a work dir of 1,000
    records took a build from 17 to 80 s when every one was replayed).
    """

    def __init__(self, work_dir: Path, modules: Sequence[IRModule], keep: int = KEEP) -> None:
        self.work_dir = work_dir
        self.memory = ms.database.MemoryDatabase()
        self.modules = {workload_key(m): m for m in modules}
        self.lines: dict[str, int] = {}
        self.count = self.read_to = 0  # workload lines numbered, bytes of them read
        with locked(work_dir, shared=True):  # reading: a read-only work dir is fine
            self._number(self._filed_since())
            _, entries = read_records(work_dir)
        wanted = ((e.key, _seconds(e) if e.key in self.modules else None) for e in entries)
        for position in fastest(wanted, keep):  # in the files' order
            self._load(entries[position])

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
        """Copy the valid records of these modules from another work dir's database (each
        checked as this one's are), leaving out those already here; returns how many."""
        have = {_same(e) for e in read_records(self.work_dir)[1]}
        copied = 0
        for entry in read_records(source)[1]:
            if entry.key in self.modules and _measured(entry) and _same(entry) not in have:
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


def _measured(entry: Entry) -> bool:
    """A valid measurement: run times under MetaSchedule's failure mark (1e10 s)."""
    return _seconds(entry) is not None


def _seconds(entry: Entry) -> float | None:
    """The mean of a valid measurement's run times, else None."""
    try:
        seconds = float(sum(entry.run_secs) / len(entry.run_secs)) if entry.run_secs else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds is not None and 0 < seconds < 1e9 else None


def trace_json(trace: Any) -> Any:
    """A schedule's trace as the plain JSON a record holds (index maps as object JSON text)."""
    return _plain(trace.as_json(remove_postproc=False))


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
