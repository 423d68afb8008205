"""The tuners' logs after a crash: a cut last line is set aside before any tuner reads them.

Every tuner appends one JSON record a line. A hard kill or a full disk can cut the line being
written, and TVM's own readers then fail on it (AutoTVM's and MetaSchedule's with a
``JSONDecodeError``, Ansor's with a ``TVMError``), making the whole work dir unusable. Before a
``tune`` or ``compile`` hands a log to its tuner, such a line is moved to ``<log>.damaged``
beside it, with one warning naming it (:func:`..adapters.journal.set_aside_cut_line`, holding
the work dir's lock, so that no writer is mid-line); nothing finished is lost, since the cut
record never was one.
"""

from __future__ import annotations

from pathlib import Path

from ..adapters import Adapter
from ..adapters.journal import locked, set_aside_cut_line, whole
from ..errors import TuningError
from .defaults import DEFAULTS_FILE

#: What is written into a work dir besides the tuners' logs: MetaSchedule's per-task logs
#: folder, Ansor's latency estimates, the default schedules' latencies.
OTHER_OUTPUTS = ("logs", "total_latency.tsv", DEFAULTS_FILE)


def refuse_links(folder: Path, adapter: Adapter) -> None:
    """The tuners append to their logs by name, following a symbolic link: a work dir from
    elsewhere whose ``autotvm.log`` points at a file of the user's would have records appended
    to that file. Such a log is refused before any tuner opens it."""
    for name in (*adapter.logs, *OTHER_OUTPUTS):
        if (folder / name).is_symlink():
            raise TuningError(f"{folder / name} is a symbolic link; a work dir's records are "
                              "written only inside it: remove the link")  # fmt: skip


def set_aside_cut_lines(folder: Path, adapter: Adapter) -> None:
    """Set aside a cut last line of each of ``adapter``'s logs in ``folder`` (damage before
    the last line is left for the readers to name)."""
    if all(whole(folder / name) for name in adapter.logs):
        return  # nothing to set aside: no lock taken (a compile may read a read-only work dir)
    with locked(folder):
        for name in adapter.logs:
            set_aside_cut_line(folder / name)
