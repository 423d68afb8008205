"""``relay-tasks prune`` and ``export``: a work dir cut down to what a build and a search need,
in place or into files TVM's own readers take.

A tune for a week, or a fleet's shared work dir, holds far more records than any command
uses: a build applies the best of each task, a search seeds from a few. Pruning keeps, per
task, its ``keep`` fastest valid records and the first failure of each cause (what ``status``
shows of them), and rewrites the tuner's files in their own formats.

A tuner's records and the causes of its failures (and MetaSchedule's measurement times) are
files matched line by line, so they are replaced together: every new file is written and
flushed beside its old one, then a marker naming them is written, then each is renamed over
the old. A crash before the marker leaves the old files (the new ones are removed on the next
look); after it, the next command that reads the work dir finishes the renames
(:func:`finish_prune`). Pruning takes the work dir's tune lock exclusively, so it is refused
while a tune runs, and a tune that starts meanwhile waits for it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from ..adapters import ADAPTERS, Adapter
from ..adapters.base import Measurement, RecordFiles, fastest, record_lines
from ..adapters.journal import locked, open_lock, set_aside_cut_line
from ..errors import TuningError, UsageError
from ..files import read_regular, write_all

#: Held (shared) by every running tune, exclusively by a prune.
TUNING_LOCK = ".tuning"
#: Names the files a prune is renaming into place; present only between its first and last rename.
MARKER = ".prune"
#: What a pruned file is called until it is renamed over the old one.
NEW_SUFFIX = ".pruned"
#: The only names a marker may hold: the record files of the tuners (a marker is data).
KNOWN = frozenset(name for a in ADAPTERS.values() for name in a.files.matched)


@dataclass(frozen=True)
class Pruned:
    """What a prune did: records before and after, bytes of the record files before and after."""

    records: int
    kept: int
    size: int
    new_size: int

    def summary(self, folder: Path) -> str:
        dropped = self.records - self.kept
        freed = self.size - self.new_size
        return (f"pruned {folder}: kept {self.kept:,} of {self.records:,} records ({dropped:,} "
                f"dropped, {freed:,} of {self.size:,} bytes freed)")  # fmt: skip


@contextmanager
def tuning(folder: Path, *, exclusive: bool = False) -> Iterator[None]:
    """Hold the work dir's tune lock: shared for a tune (several may share a work dir), waiting
    for a prune under way; ``exclusive`` for a prune, refused at once while a tune holds it."""
    try:
        fd = open_lock(folder / TUNING_LOCK)
    except OSError as err:
        raise TuningError(f"cannot lock {folder / TUNING_LOCK}: {err.strerror}") from err
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
        except BlockingIOError as err:
            raise TuningError(f"a tune is running in {folder}; prune it when that tune ends "
                              "(pruning rewrites the files it appends to)") from err  # fmt: skip
        yield
    finally:
        os.close(fd)


def prune(adapter: Adapter, folder: Path, keep: int) -> Pruned:
    """Keep, per task, the ``keep`` fastest valid records of ``folder`` and the first failure of
    each cause; the tuner's files rewritten as one change (see the module's doc)."""
    files = _record_files(adapter, keep, "prune")
    with tuning(folder, exclusive=True), locked(folder):
        _finish(folder)
        for name in adapter.logs:
            set_aside_cut_line(folder / name)
        measured = adapter.measurements(folder)  # every record checked, as any command does
        lines = [line for _, line in record_lines(folder / files.records)]
        if len(lines) != len(measured):
            raise TuningError(f"{folder / files.records}: {len(lines)} lines hold "
                              f"{len(measured)} records; restore the file")  # fmt: skip
        chosen = kept(measured, keep)
        causes = [line for _, line in record_lines(folder / files.causes)]
        failures = [i for i, m in enumerate(measured) if not m.valid]
        cause_of = dict(zip(failures, causes, strict=False))  # failures before causes were kept
        new = {
            files.records: [lines[i] for i in chosen],
            files.causes: [cause_of[i] for i in chosen if i in cause_of],
        }
        if files.times:
            new[files.times] = [json.dumps({"t": measured[i].at}) for i in chosen]
        new = {name: text for name, text in new.items() if text or (folder / name).exists()}
        size = sum(_size(folder / name) for name in new)
        _replace(folder, new)
    return Pruned(len(measured), len(chosen), size, sum(_size(folder / name) for name in new))


def _record_files(adapter: Adapter, keep: int, doing: str) -> RecordFiles:
    """The adapter's record files, once ``keep`` is a count of records a task."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise UsageError(f"--keep must be a whole number of at least 1, got {keep!r}")
    if not adapter.files.records:
        raise UsageError(f"{adapter.name} keeps no records relay-tasks can {doing}")
    return adapter.files


def kept(measured: Sequence[Measurement], keep: int, *, failures: bool = True) -> list[int]:
    """The positions of the records a prune keeps, in their order: per task its ``keep``
    fastest valid ones (the earlier of equal ones) and (``failures``) the first failure of each
    cause."""
    chosen = set(fastest(((m.key, m.seconds if m.valid else None) for m in measured), keep))
    causes: set[tuple[str, str]] = set()
    for i, m in enumerate(measured):
        if failures and not m.valid and (m.key, m.error) not in causes:
            causes.add((m.key, m.error))
            chosen.add(i)
    return sorted(chosen)


def export_best(adapter: Adapter, folder: Path, output: Path, keep: int = 1) -> int:
    """Write the ``keep`` fastest valid records of each task of ``folder`` to ``output`` in the
    tuner's own format, for TVM's readers (``tvmc compile --tuning-records``,
    ``apply_history_best``, ``ApplyHistoryBest``, MetaSchedule's ``JSONDatabase``): AutoTVM's
    and Ansor's a log file, MetaSchedule's a folder holding the database's two files. Returns
    how many records were written."""
    files = _record_files(adapter, keep, "export")
    with locked(folder, shared=True):
        measured = adapter.measurements(folder)
        lines = [line for _, line in record_lines(folder / files.records)]
        workloads = [name for name in adapter.logs if name not in files.matched]
        copied = {name: read_regular(folder / name) or b"" for name in workloads}
    chosen = [lines[i] for i in kept(measured, keep, failures=False)]
    data = "".join(line + "\n" for line in chosen).encode()
    if not workloads:
        _write_new(output, data)
        return len(chosen)
    if output.exists() and not output.is_dir():
        raise UsageError(
            f"{output} is a file; {adapter.name} records go to a folder: name a new one"
        )
    if not output.parent.is_dir():
        raise UsageError(f"{output.parent} is not a folder; create it first")
    output.mkdir(exist_ok=True)
    for name, content in copied.items():  # records point into them by line number
        _write_new(output / name, content)
    _write_new(output / files.records, data)
    return len(chosen)


def _write_new(path: Path, data: bytes) -> None:
    """``path`` holding ``data``, whole or not at all (written beside it, then renamed)."""
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent} is not a folder; create it first")
    fresh = path.with_name(path.name + NEW_SUFFIX)
    _write_fresh(fresh, data)
    os.replace(fresh, path)


def _write_fresh(path: Path, data: bytes) -> None:
    """``data`` in a file of its own, on disk before it is renamed anywhere."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(folder: Path, new: dict[str, list[str]]) -> None:
    """Write each file's new lines beside it, then the marker, then rename them all."""
    for name, text in new.items():
        data = "".join(line + "\n" for line in text).encode()
        _write_fresh(folder / (name + NEW_SUFFIX), data)
    _write_marker(folder, list(new))
    _finish(folder)


def _write_marker(folder: Path, names: list[str]) -> None:
    path = folder / (MARKER + NEW_SUFFIX)
    path.write_text(json.dumps(names))
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
    os.rename(path, folder / MARKER)
    _sync(folder)


def _finish(folder: Path) -> None:
    """Complete a prune a crash cut short (called holding the work dir's lock): with its marker,
    every new file still beside its old one is renamed into place; without it, new files are
    removed (the old ones were never touched)."""
    marker = folder / MARKER
    try:
        names = json.loads(read_regular(marker) or b"null")
    except (ValueError, UnicodeDecodeError) as err:
        raise TuningError(f"{marker} is damaged; remove it and the *{NEW_SUFFIX} files") from err
    if names is not None:
        if not isinstance(names, list) or not all(n in KNOWN for n in names):
            raise TuningError(f"{marker} is damaged; remove it and the *{NEW_SUFFIX} files")
        for name in names:
            with suppress(FileNotFoundError):
                os.rename(folder / (name + NEW_SUFFIX), folder / name)
        _sync(folder)
        marker.unlink()
    for stale in folder.glob("*" + NEW_SUFFIX):
        stale.unlink()


def finish_prune(folder: Path) -> None:
    """Before reading a work dir: finish what a crashed prune left (nothing to do, the common
    case, costs one look for the marker). A work dir this process cannot write is left as is."""
    if not (folder / MARKER).exists() and not any(folder.glob("*" + NEW_SUFFIX)):
        return
    if os.access(folder, os.W_OK):
        with locked(folder):
            _finish(folder)


def _sync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0
