"""The tuners' logs after a crash: a cut last line is set aside before any tuner reads them.

Every tuner appends one JSON record a line. A hard kill or a full disk can cut the line being
written, and TVM's own readers then fail on it (AutoTVM's and MetaSchedule's with a
``JSONDecodeError``, Ansor's with a ``TVMError``), making the whole work dir unusable. Before a
``tune`` or ``compile`` hands a log to its tuner (holding the work dir's lock, so no writer is
mid-line), such a line is moved to ``<log>.damaged`` beside it, with one warning naming it;
nothing finished is lost, since the cut record never was one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..adapters import Adapter
from ..adapters.base import open_appending
from ..errors import DamagedRecordWarning, TuningError, warn

#: What the tuners write into a work dir besides their logs: MetaSchedule's per-task logs
#: folder, Ansor's latency estimates.
OTHER_OUTPUTS = ("logs", "total_latency.tsv")
#: What a set-aside line's file is called: the log's name and this suffix.
DAMAGED_SUFFIX = ".damaged"


def refuse_links(folder: Path, adapter: Adapter) -> None:
    """The tuners append to their logs by name, following a symbolic link: a work dir from
    elsewhere whose ``autotvm.log`` points at a file of the user's would have records appended
    to that file. Such a log is refused before any tuner opens it."""
    for name in (*adapter.logs, *OTHER_OUTPUTS):
        if (folder / name).is_symlink():
            raise TuningError(f"{folder / name} is a symbolic link; a work dir's records are "
                              "written only inside it: remove the link")  # fmt: skip


def set_aside_cut_lines(folder: Path, adapter: Adapter) -> None:
    """Move a cut last line of each of ``adapter``'s logs in ``folder`` aside, warning once per
    line (damage before the last line is left for the readers to name)."""
    for name in adapter.logs:
        path = folder / name
        cut = _cut_last_line(path)
        if cut is None:
            continue
        number, start, data = cut
        aside = path.with_name(path.name + DAMAGED_SUFFIX)
        try:
            with open_appending(aside) as keep:
                keep.write(data.rstrip(b"\n") + b"\n")
            os.truncate(path, start)
        except OSError as err:
            raise TuningError(
                f"cannot set aside the cut last line of {path}: {err.strerror}"
            ) from err
        warn(
            f"{path}, line {number}: cut short (a crash or a full disk while it was written); "
            f"set aside in {aside.name}, the records before it are kept",
            DamagedRecordWarning,
        )


def _cut_last_line(path: Path) -> tuple[int, int, bytes] | None:
    """(line number, byte offset, bytes) of the last line if it is no JSON record, else None."""
    if not path.exists():
        return None
    data = path.read_bytes()
    body = data.rstrip(b"\n\r\t ")
    start = body.rfind(b"\n") + 1
    last = body[start:]
    if not last:
        return None
    try:
        json.loads(last)
        return None
    except ValueError:
        return body.count(b"\n") + 1, start, data[start:]
