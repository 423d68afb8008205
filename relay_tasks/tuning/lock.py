"""One writer per work dir: a tune holds its lock exclusively, a compile shares it.

Two tunes writing one work dir interleave their databases (MetaSchedule files each workload
twice and points records into the wrong copy) and both exit 0; a compile reading a database
being written can build with half a record. The lock is an advisory ``flock`` on ``.lock`` in
the work dir: the kernel drops it when its holder dies, so a lock left by a killed process is
taken over without asking, and the tuning worker inherits it, so a work dir stays locked while
an orphaned worker still writes to it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import TuningError

#: The lock file, in the work dir; it holds the holder's description (verb and pid).
LOCK_FILE = ".lock"


@contextmanager
def held(folder: Path, verb: str, *, exclusive: bool) -> Iterator[int | None]:
    """Hold the work dir's lock for ``verb`` (exclusively for a tune); yields the lock's file
    descriptor, or None where a reader finds no lock file to share (no tune ever ran there)."""
    fd = _open(folder / LOCK_FILE, create=exclusive)
    if fd is None:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise TuningError(
                f"{folder} is in use by {holder}; wait for it to end or stop it, or give "
                "another --work-dir"
            ) from None
        if exclusive:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"relay-tasks {verb} (pid {os.getpid()})\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)


def _open(path: Path, *, create: bool) -> int | None:
    flags = os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY)
    try:
        return os.open(path, flags, 0o644)
    except (FileNotFoundError, NotADirectoryError):
        if create:
            raise
        return None  # no work dir (yet): the reader says what is missing
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise TuningError(f"{path} is a symbolic link; remove it (a lock is never "
                              "followed out of the work dir)") from err  # fmt: skip
        if not create and err.errno in (errno.EACCES, errno.EROFS):
            return None  # a read-only work dir: nobody can be writing it through relay-tasks
        raise TuningError(f"cannot lock {path}: {err.strerror}") from err
