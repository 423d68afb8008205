"""Reading the files a work dir or a task file holds: regular files only, never waiting.

A work dir travels between machines, so any name in it may be something else than the file
``tune`` wrote: a FIFO (whose ``open`` waits for a writer and whose read waits for data, so
``status`` would hang for ever), a device (``/dev/zero`` reads for ever), a folder, or a link
out of the work dir. Each file is opened non-blocking and without following a link (where the
format keeps it inside its folder), checked to be a regular file on the open descriptor (no
race with a rename), and read to a bound.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import ModelError

#: No file a work dir or a task file holds is larger (a million MetaSchedule records is 1.5 GB).
MAX_BYTES = 4 << 30


def write_all(fd: int, data: bytes | memoryview) -> None:
    """All of ``data`` to ``fd``: one write, unless the disk fills (then its error is raised)
    or a pipe takes it in parts."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def read_regular(
    path: Path, *, follow: bool = False, offset: int = 0, limit: int = MAX_BYTES
) -> bytes | None:
    """The bytes of ``path`` from ``offset``, None if there is no such file.

    ``ModelError`` naming the file when it is a link (unless ``follow``), not a regular file, or
    larger than ``limit``. ``follow`` is for a file the user names: a task file given on the
    command line may be a link they made.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ModelError(
                f"{path} is a symbolic link, and relay-tasks reads this file only where it "
                "was written: put the file itself there"
            ) from err
        raise ModelError(f"{path}: cannot read it ({err.strerror})") from err
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise ModelError(
                f"{path} is not a regular file (a FIFO, a device or a folder), which relay-tasks "
                "never writes there: remove it"
            )
        if status.st_size - offset > limit:
            raise ModelError(f"{path} holds {status.st_size:,} bytes, more than the "
                             f"{limit:,} any such file holds: remove it")  # fmt: skip
        chunks = []
        position = offset
        while chunk := os.pread(fd, 1 << 24, position):
            chunks.append(chunk)
            position += len(chunk)
            if position - offset > limit:  # a file still growing past the bound
                raise ModelError(f"{path} grew past {limit:,} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)
