"""Appending to a work dir that several tunes write at once: whole lines, under one lock.

A work dir is a database several ``tune`` processes may share (one per model, say). Each
tuner's own writer is unfit for that: AutoTVM's appends a batch through an 8 KiB buffer and
Ansor's through a C++ stream, so two processes' lines can interleave mid-line; a record and its
failure's cause go to two files, matched by order, which another writer can come between; and
MetaSchedule's records point at workloads by line number, a number another writer can take
first. So every write of records goes through :func:`append`: under an exclusive ``flock`` of
the work dir's ``.lock``, each file gets its lines in one ``write``, the records and their
causes together. The lock is held for the write only, and the kernel drops it with its holder,
so a killed writer blocks nobody.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ..errors import DamagedRecordWarning, TuningError, warn
from ..files import read_regular, write_all
from .base import is_json

#: The lock file, in the work dir.
LOCK_FILE = ".lock"
#: What a set-aside line's file is called: the log's name and this suffix.
DAMAGED_SUFFIX = ".damaged"


@contextmanager
def locked(work_dir: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold the work dir's lock (waiting for whoever holds it: writes are short): exclusively
    to write, ``shared`` to read. A reader of a work dir it cannot write (records shipped to
    another machine, a read-only mount) reads without the lock: none of its writers is here."""
    path = work_dir / LOCK_FILE
    try:
        fd = open_lock(path)
    except OSError as err:
        if shared and err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            yield
            return
        raise TuningError(f"cannot lock {path}: {err.strerror}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def open_lock(path: Path) -> int:
    """A lock file of the work dir opened (made if missing) for ``flock``; one that is a link
    is a ``TuningError``, never followed out of the work dir; other failures raise ``OSError``."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise TuningError(f"{path} is a symbolic link; remove it (a lock is never "
                              "followed out of the work dir)") from err  # fmt: skip
        raise


def append(work_dir: Path, lines: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Append each ``(file name, lines)`` in ``work_dir``, all under the lock, each file's lines
    in one write. A file whose last line a dead writer cut short gets that line set aside
    first (see :func:`set_aside_cut_line`), so the cut never glues onto a record."""
    with locked(work_dir):
        write_locked(work_dir, lines)


def write_locked(work_dir: Path, lines: Sequence[tuple[str, Sequence[str]]]) -> None:
    """:func:`append` for a caller already holding the lock (a second ``flock`` of the same
    file from one process waits for the first)."""
    for name, text in lines:
        if not text:
            continue
        path = work_dir / name
        set_aside_cut_line(path)
        data = "".join(line.rstrip("\n") + "\n" for line in text).encode()
        with open_appending(path) as handle:
            write_all(handle.fileno(), data)


def set_aside_cut_line(path: Path) -> None:
    """Move a last line that a write cut short (every writer ends its lines; a line without
    its newline is cut, unless it is a whole JSON record, which gets its newline) to
    ``<name>.damaged``, warning once: the records before it are kept, and the cut one never
    was one. Call it holding the lock, so that no writer is mid-line."""
    if whole(path):
        return  # the common case, from the last byte alone (a log grows to megabytes)
    data = read_regular(path) or b""
    start = data.rfind(b"\n") + 1
    if start and not is_json(data[: data.find(b"\n")]):
        return  # no log the tuner wrote (its first line is no record): its reader says so
    aside = path.with_name(path.name + DAMAGED_SUFFIX)
    try:
        if is_json(data[start:]):
            with open_appending(path) as handle:
                handle.write(b"\n")
            return
        with open_appending(aside) as keep:
            keep.write(data[start:] + b"\n")
        os.truncate(path, start)
    except OSError as err:
        raise TuningError(f"cannot set aside the cut last line of {path}: {err.strerror}") from err
    number = data.count(b"\n", 0, start) + 1
    warn(
        f"{path}, line {number}: cut short (a crash or a full disk "
        f"while it was written); set aside in {aside.name}, the records before it are kept",
        DamagedRecordWarning,
    )


def whole(path: Path) -> bool:
    """Whether ``path`` is missing, empty or ends its last line (a cut line does not)."""
    try:
        size = os.lstat(path).st_size
    except FileNotFoundError:
        return True
    last = read_regular(path, offset=max(size - 1, 0))  # refuses what is no regular file
    return not last or last.endswith(b"\n")


def open_appending(path: Path) -> BinaryIO:
    """``path`` opened to append to, created if missing; a symbolic link there raises
    ``OSError`` (ELOOP) instead of being followed: a work dir from elsewhere could point a log at
    any file of the user's."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK  # no FIFO wait
    fd = os.open(path, flags, 0o644)
    return os.fdopen(fd, "ab")
