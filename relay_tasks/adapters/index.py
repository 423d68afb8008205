"""A work dir's records summed up per task, kept in an index beside them, so that a command's
cost does not grow with the history: ``status``, ``compile`` and a resumed ``tune`` read the
index and the lines appended since, then only the records they use.

Each task's tally holds its valid and failed counts, its failures' causes, and its
:data:`KEEP` fastest valid records by line number and byte offset. The index is a hint, never
trusted: it says which lines to read, and every line read is checked by the tuner's reader as
any record is (the line must start where the index says, after a newline). It names the size
of each file it covers and a digest of that prefix's samples (its first and last 4 KiB and
:data:`SAMPLES` windows between); a file that shrank or whose samples differ (a prune, an
edit, another work dir copied over) makes the index be built again from the records, as does
an index that is not one this module writes. Records are only ever appended (a prune
rewrites them, and the digest then differs), so the lines past the size it covers are the
new ones: those are read and added. Any reader brings the index up to date; it is written
beside the records by rename, under the work dir's shared lock (writers append under the
exclusive one, so a reader never sees a record without its cause), and not at all where the
work dir cannot be written.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..files import line_at, open_regular, read_regular, write_all
from ..scratch import scratch_dir
from .base import Adapter, Line, Measurement, RecordFiles, TunerTask, failure, scan
from .journal import append, locked

#: The valid records of each task the index keeps, fastest first: more than any command reads.
KEEP = 256
#: The fastest valid records of each task a tune reads of its history: its cost model learns
#: them, its search seeds from them, ``--reuse`` copies them (a build checks 5). A bounded
#: sample: replaying and learning 256 a task made a resumed DCGAN tune 10 s slower to start
#: at 10,000 records than at 100.
SEED = 32
#: Windows sampled between a file's first and last 4 KiB for its digest.
SAMPLES = 32
#: The index's format; an index of another is built again.
FORMAT = 1
#: The largest index read: 256 records a task of thousands of tasks.
MAX_INDEX = 64 << 20
#: Record lines parsed and added at a time while the index catches up.
BATCH = 2048

#: A tuner's reader of record lines (:attr:`.base.Adapter.read`).
Reader = Callable[[Path, Iterable[Line]], Iterator[Measurement]]


@dataclass
class TaskTally:
    """One task's records summed up: counts, causes of failures (the first one first), and
    its fastest valid records as ``(seconds, line number, byte offset)``, fastest first."""

    valid: int = 0
    failed: int = 0
    causes: Counter[str] = field(default_factory=Counter)
    first_error: str = ""
    best: list[tuple[float, int, int]] = field(default_factory=list)

    def add(self, m: Measurement, number: int, offset: int) -> None:
        if not m.valid:
            self.failed += 1
            if m.error:
                self.first_error = self.first_error or m.error
                self.causes[m.error] += 1
            return
        self.valid += 1
        if len(self.best) < KEEP or float(m.seconds) < self.best[-1][0]:  # type: ignore[arg-type]
            bisect.insort(self.best, (float(m.seconds), number, offset))  # type: ignore[arg-type]
            del self.best[KEEP:]


@dataclass
class Tally:
    """Every task's :class:`TaskTally`, by task key."""

    tasks: dict[str, TaskTally] = field(default_factory=dict)
    last: str = ""  # the task of the last record (the one a tune measures now)

    def add(self, m: Measurement, number: int, offset: int = -1) -> None:
        self.tasks.setdefault(m.key, TaskTally()).add(m, number, offset)
        self.last = m.key

    def of(self, key: str) -> TaskTally:
        return self.tasks.get(key) or TaskTally()

    def valid_for(self, keys: Iterable[str]) -> int:
        """The valid measurements of the tasks ``keys``: a work dir shared by several models
        holds records of other tasks too, which fill no budget of these."""
        return sum(self.of(k).valid for k in set(keys))

    def measured(self) -> set[str]:
        """The tasks with a record, valid or failed."""
        return {k for k, t in self.tasks.items() if t.valid or t.failed}

    def fastest(self, keys: Iterable[str], keep: int) -> list[tuple[int, int]]:
        """``(line number, byte offset)`` of the ``keep`` fastest valid records of each task
        of ``keys``, in the file's order."""
        return sorted((n, o) for k in set(keys) for _, n, o in self.of(k).best[:keep])


#: A work dir's records: summed up per task (what its index holds), or one by one.
Records = Tally | Sequence[Measurement]


def as_tally(records: Records) -> Tally:
    """``records`` summed up per task."""
    return records if isinstance(records, Tally) else tally_of(records)


def tally_of(measurements: Iterable[Measurement]) -> Tally:
    """The tally of measurements read some other way (positions stand for line numbers)."""
    tally = Tally()
    for position, m in enumerate(measurements, start=1):
        tally.add(m, position)
    return tally


def history(read: Reader, work_dir: Path, files: RecordFiles) -> list[Measurement]:
    """Every record of ``work_dir`` in order, with the causes of its failures: what the plot
    and a prune need, and the one reader that costs the whole history."""
    causes = _causes(work_dir / files.causes)
    return [_with_cause(m, causes) for m in read(work_dir, scan(work_dir / files.records))]


def _with_cause(m: Measurement, causes: Iterator[tuple[str, int]]) -> Measurement:
    """A failure with the next cause joined to its error's name (causes are kept a line a
    failure, in the order of the failures)."""
    return m if m.seconds is not None else _joined(m, next(causes)[0])


def _joined(m: Measurement, cause: str) -> Measurement:
    """A failure with its kept cause joined to the tuner's name for it (if it names one)."""
    return Measurement(m.key, None, failure(m.error, cause) if m.error else cause, m.at)


def _causes(path: Path, offset: int = 0) -> Iterator[tuple[str, int]]:
    """The causes kept in ``path`` from ``offset`` with the offset after each, then ``"unknown
    error"`` for ever (for failures logged before their causes were) at the offset reached."""
    for line in scan(path, offset):
        if line.end is None:
            break  # a cut cause is no cause; it is read again when whole
        cause = line.value.get("error") if isinstance(line.value, dict) else None
        offset = line.end
        yield (cause if isinstance(cause, str) else "unknown error"), offset
    while True:
        yield "unknown error", offset


def tally(read: Reader, work_dir: Path, files: RecordFiles) -> Tally:
    """The tally of ``work_dir``'s records from its index brought up to date (built anew
    where it is stale, damaged or missing), and the index written back where it changed."""
    guards = [files.workloads] if files.workloads else []  # it may only grow
    if not work_dir.is_dir():
        return Tally()  # nothing tuned there yet
    with locked(work_dir, shared=True):
        names = [files.records, files.causes, *guards]
        index = _load(work_dir / _index_name(files), work_dir, names)
        state = index or _State.empty()
        grown = state.extend(read, work_dir, files)
        if grown or index is None:
            sizes = {n: _size(work_dir / n) for n in guards}
            sizes |= {files.records: state.covered, files.causes: state.causes_at}
            _save(work_dir, _index_name(files), state, sizes)
    return state.tally


def records_at(
    read: Reader, work_dir: Path, files: RecordFiles, spots: Sequence[tuple[int, int]]
) -> list[tuple[Line, Measurement]]:
    """The records at ``spots`` (``(line number, byte offset)`` from a :class:`Tally`), each
    read and checked by the tuner's reader: a spot where no whole line starts is a stale index,
    and the records are read in full instead."""
    path = work_dir / files.records
    lines = []
    for number, offset in spots:
        data = line_at(path, offset)
        try:
            text = data.decode("utf-8", errors="replace") if data is not None else ""
            lines.append(Line(number, offset, text, json.loads(text)))
        except (ValueError, RecursionError):  # "": no whole line starts there
            return _reindexed(read, work_dir, files, spots)
    return list(zip(lines, read(work_dir, lines), strict=True))


def _reindexed(
    read: Reader, work_dir: Path, files: RecordFiles, spots: Sequence[tuple[int, int]]
) -> list[tuple[Line, Measurement]]:
    """What :func:`records_at` reads when its index was wrong: the index is removed, and the
    records at the same line numbers are taken from a full read."""
    (work_dir / _index_name(files)).unlink(missing_ok=True)
    wanted = {number for number, _ in spots}
    lines = [line for line in scan(work_dir / files.records) if line.number in wanted]
    return list(zip(lines, read(work_dir, lines), strict=True))


def _index_name(files: RecordFiles) -> str:
    return f"{files.records}.index"


@dataclass
class _State:
    """What the index holds: the tally, and how far it covers the records (bytes, lines) and
    the causes (bytes)."""

    tally: Tally
    covered: int
    lines: int
    causes_at: int

    @classmethod
    def empty(cls) -> _State:
        return cls(Tally(), 0, 0, 0)

    def extend(self, read: Reader, work_dir: Path, files: RecordFiles) -> bool:
        """Add the whole record lines past what is covered, :data:`BATCH` at a time (memory
        holds one batch of parsed records, never the log); whether there were any."""
        lines = scan(work_dir / files.records, self.covered, self.lines)
        causes = _causes(work_dir / files.causes, self.causes_at)
        grown = False
        while batch := list(islice(lines, BATCH)):
            whole = [line for line in batch if line.end is not None]
            for line, m in zip(whole, read(work_dir, whole), strict=True):
                if m.seconds is None:
                    cause, self.causes_at = next(causes)
                    m = _joined(m, cause)
                self.tally.add(m, line.number, line.offset)
            if whole:
                grown = True
                self.covered, self.lines = int(whole[-1].end or 0), whole[-1].number
            if len(whole) < len(batch):
                break  # a line being written, or cut: read again when whole
        return grown


def _size(path: Path) -> int:
    fd = open_regular(path)
    if fd is None:
        return 0
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _digest(path: Path, size: int) -> str:
    """A digest of the first ``size`` bytes of ``path``, from samples: its first and last 4 KiB
    and :data:`SAMPLES` windows of 512 bytes between (reading all of a gigabyte log would cost
    what the index saves)."""
    fd = open_regular(path)
    digest = hashlib.sha256(str(size).encode())
    if fd is None:
        return digest.hexdigest()
    try:
        ends = {0, max(0, size - 4096)}
        between = {size * i // (SAMPLES + 1) for i in range(1, SAMPLES + 1)}
        for spot in sorted(ends | between):
            length = 4096 if spot in ends else 512
            digest.update(os.pread(fd, max(0, min(length, size - spot)), spot))
        return digest.hexdigest()
    finally:
        os.close(fd)


def _save(work_dir: Path, name: str, state: _State, sizes: dict[str, int]) -> None:
    """Write the index, with the covered ``sizes`` of its files, by rename (a reader sees the
    old one or the new one whole); a work dir this process cannot write keeps none."""
    document = {
        "format": FORMAT,
        "covered": state.covered,
        "lines": state.lines,
        "causes_at": state.causes_at,
        "files": {n: [s, _digest(work_dir / n, s)] for n, s in sizes.items()},
        "tasks": {
            key: [t.valid, t.failed, t.first_error, sorted(t.causes.items()), t.best]
            for key, t in state.tally.tasks.items()
        },
        "last": state.tally.last,
    }
    data = json.dumps(document, separators=(",", ":")).encode()
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=work_dir)
    except OSError:
        return
    try:
        write_all(fd, data)
        os.close(fd)
        os.replace(temporary, work_dir / name)
    except OSError:
        os.unlink(temporary)


def _load(path: Path, work_dir: Path, names: Sequence[str]) -> _State | None:
    """The index at ``path`` if it is one this module wrote and every file it covers still
    begins with what it covered; else None (it is built anew)."""
    try:
        data = read_regular(path, limit=MAX_INDEX)
        document = json.loads(data) if data is not None else None
        return None if document is None else _checked(document, work_dir, names)
    except (ModelError, ValueError, RecursionError, TypeError, KeyError, IndexError):
        return None


def _checked(document: Any, work_dir: Path, names: Sequence[str]) -> _State | None:
    """The state of an index document whose fields have the types written and whose files
    match their digests, else None (a ``TypeError`` or ``KeyError`` of a malformed one is
    caught by the caller alike)."""
    fields = ("format", "covered", "lines", "causes_at", "files", "tasks", "last")
    if set(document) != set(fields) or document["format"] != FORMAT:
        return None
    numbers = [document[f] for f in fields[1:4]]
    files = document["files"]
    if any(type(n) is not int or n < 0 for n in numbers) or set(files) != set(names):
        return None
    for name, (size, digest) in files.items():
        if type(size) is not int or _size(work_dir / name) < size:
            return None
        if digest != _digest(work_dir / name, size):
            return None
    tally = Tally(last=str(document["last"]))
    for key, (valid, failed, first, causes, best) in document["tasks"].items():
        counts = Counter({str(c): int(n) for c, n in causes})
        ranked = sorted((float(s), int(n), int(o)) for s, n, o in best)[:KEEP]
        if not all(0 < s < 1e9 for s, _, _ in ranked) or not isinstance(first, str):
            return None
        tally.tasks[str(key)] = TaskTally(int(valid), int(failed), counts, first, ranked)
    covered, lines, causes_at = numbers
    return _State(tally, covered, lines, causes_at)


def tally_in(adapter: Adapter, work_dir: Path) -> Tally:
    """The tally of ``work_dir``'s records for ``adapter``'s tuner (:func:`tally`); every file
    of its logs must be a regular file or missing, read now or not (a FIFO is refused by
    every command alike, never waited on)."""
    for name in adapter.logs:
        fd = open_regular(work_dir / name)
        if fd is not None:
            os.close(fd)
    return tally(adapter.read, work_dir, adapter.files)


def filled(
    read: Reader, files: RecordFiles, work_dir: Path, keys: Iterable[str], trials: int
) -> Callable[[], bool]:
    """Whether ``work_dir`` holds ``trials`` valid measurements of the tasks ``keys`` by now,
    asked between a tune's rounds: another tune of the same tasks into the same work dir fills
    the budget too (two at once each measured what was missing when it started: 32 where 16
    were missing). Each look reads only the lines appended since the last."""
    wanted = list(keys)
    return lambda: tally(read, work_dir, files).valid_for(wanted) >= trials


def best_records(
    read: Reader, files: RecordFiles, work_dir: Path, keys: Iterable[str], keep: int
) -> list[tuple[Line, Measurement]]:
    """The ``keep`` fastest valid records of each task of ``keys`` in ``work_dir``, in the
    file's order, each read and checked (the only records of a long history a command reads)."""
    spots = tally(read, work_dir, files).fastest(keys, keep)
    return records_at(read, work_dir, files, spots)


@contextmanager
def records_of(
    read: Reader, files: RecordFiles, tasks: Sequence[TunerTask], work_dir: Path, keep: int
) -> Iterator[Path]:
    """A temporary log holding only the ``keep`` fastest valid records of each of ``tasks``:
    what a build applies or a search seeds from, where the tuner's own reader would decode
    every line of the log."""
    chosen = best_records(read, files, work_dir, [t.key for t in tasks], keep)
    with scratch_dir("records") as folder:
        path = folder / files.records
        path.write_text("".join(line.text + "\n" for line, _ in chosen))
        yield path


def adopt_lines(
    read: Reader, files: RecordFiles, tasks: Sequence[TunerTask], source: Path, work_dir: Path
) -> int:
    """Copy the fastest valid records of ``tasks`` (:data:`SEED` a task) from another work
    dir (each checked as this work dir's are), leaving out lines already among this work dir's
    fastest; returns how many were copied."""
    keys = [t.key for t in tasks]
    have = {line.text for line, _ in best_records(read, files, work_dir, keys, SEED)}
    new = [line.text for line, _ in best_records(read, files, source, keys, SEED)]
    new = [line for line in dict.fromkeys(new) if line not in have]
    append(work_dir, [(files.records, new)])
    return len(new)
