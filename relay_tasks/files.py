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
from collections.abc import Iterator
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
    fd = open_regular(path, follow=follow)
    if fd is None:
        return None
    try:
        if os.fstat(fd).st_size - offset > limit:
            raise ModelError(f"{path} holds {os.fstat(fd).st_size:,} bytes, more than the "
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


def open_regular(path: Path, *, follow: bool = False) -> int | None:
    """``path`` opened to read (None if there is no such file), refused as :func:`read_regular`
    says; the caller closes the descriptor."""
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
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ModelError(
            f"{path} is not a regular file (a FIFO, a device or a folder), which relay-tasks "
            "never writes there: remove it"
        )
    return fd


#: Bytes read at a time where a file is read line by line (a log may be gigabytes).
CHUNK = 1 << 22
#: The longest line a reader takes from a log (a MetaSchedule record is kilobytes).
MAX_LINE = 1 << 26


def read_lines(path: Path, offset: int = 0) -> Iterator[tuple[int, bytes, bool]]:
    """The lines of ``path`` from ``offset`` (a line's start) as ``(offset, bytes, ended)``, a
    chunk at a time: memory holds one chunk, never the file. ``ended`` is False for a last line
    without its newline. A line longer than :data:`MAX_LINE` is a ``ModelError``."""
    fd = open_regular(path)
    if fd is None:
        return
    try:
        pending, start, position = b"", offset, offset
        while chunk := os.pread(fd, CHUNK, position):
            position += len(chunk)
            data = pending + chunk
            begin = 0
            while (end := data.find(b"\n", begin)) >= 0:
                yield start + begin, data[begin:end], True
                begin = end + 1
            pending, start = data[begin:], start + begin
            if len(pending) > MAX_LINE:
                raise ModelError(f"{path}: a line at byte {start:,} is longer than "
                                 f"{MAX_LINE:,} bytes, which no record is: remove it")  # fmt: skip
        if pending:
            yield start, pending, False
    finally:
        os.close(fd)


def line_at(path: Path, offset: int) -> bytes | None:
    """The whole line of ``path`` that starts at ``offset`` (without its newline), or None
    where no line starts there: ``offset`` past the end, inside a line, or a last line
    without its newline."""
    fd = None if offset < 0 else open_regular(path)
    if fd is None:
        return None
    try:
        if offset and os.pread(fd, 1, offset - 1) != b"\n":
            return None
        data = b""
        while len(data) <= MAX_LINE and (chunk := os.pread(fd, 1 << 16, offset + len(data))):
            end = chunk.find(b"\n")
            if end >= 0:
                return data + chunk[:end]
            data += chunk
        return None
    finally:
        os.close(fd)
