"""A work dir's MetaSchedule database, read and written here: TVM sees only what was derived here.

MetaSchedule's ``JSONDatabase`` reads each workload line of its files with TVM's object JSON
reader, which builds whatever nodes a file names. Here a workload line is only a structural
hash: the workload's module is the task this command derived, never the file's. Each record's
trace passes :mod:`.records`' allowlist, then MetaSchedule replays it on that module into an
in-memory database, which is all the tuner and the build see. New records go to the same two
files, one line each as it completes, in ``JSONDatabase``'s format (its readers still read them).
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import tvm
from tvm import meta_schedule as ms
from tvm.ir import IRModule

from ..errors import describe_failure
from .base import damaged, open_appending, record_lines
from .records import trace_problem

#: A record's JSON form with its index maps as objects (the Python ``as_json`` cannot hold them).
_AS_JSON = tvm.get_global_func("meta_schedule.TuningRecordAsJSON")
WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"


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
    for number, line in record_lines(records):
        try:
            index, (trace, run_secs, *rest) = json.loads(line)
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
    stay in the files, unread.
    """

    def __init__(self, work_dir: Path, modules: Sequence[IRModule]) -> None:
        self.workloads_file, self.records_file = work_dir / WORKLOADS, work_dir / RECORDS
        self.memory = ms.database.MemoryDatabase()
        self.modules = {workload_key(m): m for m in modules}
        keys, entries = read_records(work_dir)
        self.lines = {key: index for index, key in reversed(list(enumerate(keys)))}
        self.count = len(keys)
        for entry in entries:
            if entry.key in self.modules:
                self._load(entry)

    def _load(self, entry: Entry) -> None:
        workload = self.memory.commit_workload(self.modules[entry.key])
        try:
            plain = tvm.runtime.convert([entry.trace, entry.run_secs, None, entry.args_info])
            record = ms.database.TuningRecord.from_json(plain, workload)
        except (tvm.TVMError, ValueError, TypeError) as err:
            raise damaged(self.records_file, entry.number, describe_failure(err)) from err
        self.memory.commit_tuning_record(record)

    def commit(self, record: Any) -> None:
        """A measured record: into memory, and one line appended to the work dir's records
        (its workload's line first, the first time)."""
        self.memory.commit_tuning_record(record)
        mod = record.workload.mod
        key = workload_key(mod)
        if key not in self.lines:
            saved = tvm.ir.save_json(mod).encode()  # as a length-prefixed string, as TVM does
            text = base64.b64encode(struct.pack("<Q", len(saved)) + saved).decode()
            _append(self.workloads_file, [str(int(key, 16)), text])
            self.lines[key], self.count = self.count, self.count + 1
        _append(self.records_file, [self.lines[key], _plain(_AS_JSON(record))])


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


def _append(path: Path, value: Any) -> None:
    """One line in one write (O_APPEND): a crash cuts at most the last line."""
    with open_appending(path) as handle:
        handle.write((json.dumps(value, separators=(",", ":")) + "\n").encode())
