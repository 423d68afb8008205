"""Temporary folders that a killed process does not leave behind for good.

A ``TemporaryDirectory`` is removed by the process that made it, so ``kill -9``, the OOM
killer or a lost machine leaves it in /tmp, with what TVM's builders put in it. Each folder
made here carries its process's id in its name, and making one first removes this user's
folders of the same kind whose process is gone.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "relay-tasks-"

#: Seconds a folder of a gone process stays untouched before it is removed: a process id seen
#: from another PID namespace (a container sharing /tmp) may belong to a live process there,
#: which keeps touching its folder (a tune's builders make and remove theirs in it).
STALE_SECONDS = 3600.0


@contextmanager
def scratch_dir(kind: str) -> Iterator[Path]:
    """A private, empty folder for one ``kind`` of work (``worker``, ``records``), removed on
    the way out; the leftovers of its kind are swept first."""
    sweep(kind)
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sweep(kind: str, root: Path | None = None) -> int:
    """Remove the folders of ``kind`` in ``root`` (the temporary folder) that this user owns,
    whose process is gone and which nothing touched for :data:`STALE_SECONDS`; returns how
    many. A link or another user's folder under such a name is never followed or removed."""
    pattern = re.compile(rf"{re.escape(PREFIX + kind)}-(\d+)-\w+")
    oldest = time.time() - STALE_SECONDS
    removed = 0
    try:
        entries = list(os.scandir(root or tempfile.gettempdir()))
    except OSError:
        return 0
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None or _alive(int(match[1])):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mtime < oldest:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists here (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's; an id too large to ask: left
        pass
    return True
