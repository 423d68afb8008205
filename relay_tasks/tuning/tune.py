"""``relay-tasks tune``: the tuner runs in a child process that this one supervises.

TVM's tuners loop in C++ and call back into Python, where a ``KeyboardInterrupt`` is caught and
printed by TVM and tuning goes on. So the tuner gets a process of its own (its own session, so a
terminal's Ctrl-C reaches only this supervisor): SIGINT, SIGTERM or SIGHUP (the terminal closed)
here stops the child's whole process group within seconds, and the child stops by itself when
this process dies without a word (SIGKILL). MetaSchedule's records are appended one by one as
measured, AutoTVM's and Ansor's a batch at a time, so what was measured stays on disk and the
same command resumes from it. The child's
output (TVM's logs and tables) goes to ``tune.log`` in the work dir; this process shows one
progress line on a terminal, read from the records as they grow.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from ..adapters import ADAPTERS, Adapter, TunerTask, get_adapter
from ..adapters.base import Runner, Tuned, merge_equal
from ..adapters.index import Records, Tally, as_tally, tally_in
from ..adapters.journal import locked, open_appending, set_aside_cut_line
from ..errors import ModelError, TuningError, TuningInterrupted, UsageError
from ..export import TaskFile, dumps, load_tasks, tasks_document
from ..files import read_regular
from ..host import check_runs_here
from ..inputs import TargetLike, as_target
from ..scratch import scratch_dir
from .defaults import read_alike, read_defaults, stale_defaults
from .device import check_tracker, devices_left
from .logs import refuse_links
from .prune import finish_prune, tuning
from .records import Standing, standing

#: The tasks of the last tune, as a task file: which tuner and target the work dir is for.
TASKS_FILE = "tasks.json"
#: Every tune's task file, named by the models it tuned: ``status`` shows what they all tune.
TUNES_DIR = "tunes"
#: Everything the tuner prints.
LOG_FILE = "tune.log"


def failure_mark(pid: int) -> str:
    """How worker ``pid`` starts its last word when it fails, for the one-line error."""
    return f"relay-tasks-worker[{pid}]: error: "


#: Seconds a stopped worker gets before its process group is killed.
GRACE = 2.0
#: What :func:`_run_worker` returns when the time budget is spent (no signal number).
TIME_UP = -1


def tune(
    tasks: Sequence[TunerTask],
    target: TargetLike,
    *,
    tuner: str | Adapter,
    trials: int | None = 64,
    work_dir: str | Path,
    rpc_tracker: str | None = None,
    rpc_key: str | None = None,
    timeout: float = 10.0,
    reuse: Sequence[str | Path] = (),
    time_budget: float | None = None,
    seeds: bool = True,
) -> Standing:
    """Tune until ``work_dir`` holds ``trials`` valid measurements, or ``time_budget`` seconds
    have passed (whichever comes first; ``trials=None``: the time alone); returns every task's
    standing.

    The records in ``work_dir`` (AutoTVM ``autotvm.log``, Ansor ``ansor.json``, MetaSchedule's
    JSON database) are the resume point: running again keeps every finished measurement, counts
    only valid ones, and spends only the trials still missing. ``rpc_tracker`` (``host:port``)
    and ``rpc_key`` measure on devices behind a TVM RPC tracker instead of this machine.
    ``reuse`` names work dirs tuned for other models with the same tuner and target: the valid
    records of equal tasks are copied here, and those tasks are not tuned again (``trials``
    then counts the measurements of the others). With ``seeds``, a MetaSchedule task with no
    records first measures the schedules relay-tasks ships for the target's CPU family, of
    that task or of its operators at other shapes (seeds, never kept as measurements: only
    what they measure here is).

    When the time is up the tuner is stopped as a signal stops it: every record on disk is
    kept (AutoTVM and Ansor write theirs a batch at a time, so the batch under way is not).

    Raises :class:`TuningInterrupted` on SIGINT/SIGTERM/SIGHUP (measurements kept) and
    :class:`TuningError` when the tuner fails or every new measurement failed.
    """
    if trials is None and time_budget is None:
        raise UsageError("give a budget: trials, a time budget, or both")
    if trials is not None and (
        isinstance(trials, bool) or not isinstance(trials, int) or trials < 1
    ):
        raise UsageError(f"trials must be a whole number of at least 1, got {trials!r}")
    if time_budget is not None and (
        isinstance(time_budget, bool)
        or not isinstance(time_budget, (int, float))
        or not 0 < time_budget < math.inf
    ):
        raise UsageError(
            f"the time budget must be a positive number of seconds, got {time_budget!r}"
        )
    if not tasks:
        raise UsageError("there are no tasks to tune (the model has no tunable operator)")
    adapter = get_adapter(tuner)
    tgt = as_target(target)
    runner = Runner(parse_tracker(rpc_tracker, rpc_key), rpc_key, timeout)
    if runner.tracker is None:
        check_runs_here(tgt, doing="measure")
    else:
        check_tracker(runner.tracker, str(rpc_key))
    folder = work_folder(work_dir)
    finish_prune(folder)  # one a crash cut short
    with tuning(folder):  # no prune while this tune runs
        document = tasks_document(tasks, tuner=adapter.name, target=tgt, models=_models(tasks))
        with locked(folder):  # what another tune may be writing is set straight under the lock
            check_same_tuning(folder, adapter, tgt)
            refuse_links(folder, adapter)
            for name in adapter.logs:
                set_aside_cut_line(folder / name)
            file_tasks(folder, document)
        every = tasks
        tasks, reused = _reused(adapter, tgt, every, folder, reuse)
        records = tally_in(adapter, folder)  # each record checked on its own, then
        adapter.check(every, folder)  # against the tasks it would be applied to
        reused += _similar(adapter, tasks, records, reuse)
        reused += _seeded(adapter, tasks, records, tgt) if seeds else []
        before = standing(tasks, records)
        display = _Progress(adapter, tasks, folder, trials, since=before.valid,
                            defaults=runner.tracker is None)  # fmt: skip
        if reused:
            display.say("relay-tasks: " + "; ".join(reused))
        # Defaults an older relay-tasks measured its way are measured again even with the
        # budget spent (compile says to run tune for that): the worker measures them, then has
        # no more to do.
        stale = runner.tracker is None and bool(
            stale_defaults(folder) & {t.alternatives_of for t in tasks}
        )
        if not tasks or (trials is not None and before.valid >= trials and not stale):
            return standing(every, records, read_defaults(folder), read_alike(folder))
        if before.valid:
            display.say(_resuming(before, folder))
        if len(tasks) < len(every):
            document = tasks_document(tasks, tuner=adapter.name, target=tgt, models=_models(tasks))
        deadline = None if time_budget is None else time.monotonic() + time_budget
        display.deadline = deadline
        stopped = _run_worker(adapter, tasks, folder, trials, runner, document, display, reuse,
                              deadline, seeds)  # fmt: skip
        after = standing(tasks, tally_in(adapter, folder))
        if stopped == TIME_UP and time_budget is not None:
            new = after.valid - before.valid
            rate = new * 60 / time_budget
            display.say(f"relay-tasks: the time budget ({_duration(time_budget)}) is spent; "
                        f"{new} new valid measurements ({rate:.1f} a minute)")  # fmt: skip
            stopped = None
        if stopped is not None:
            raise TuningInterrupted(
                f"stopped; {after.valid} valid measurements are kept in {folder}: run the same "
                "command again to resume",
                stopped,
            )
        new_failed = after.failed - before.failed
        if after.valid == before.valid and new_failed > 0:
            raise TuningError(
                f"all {new_failed} measurements failed; the first: "
                f"{after.first_error or 'unknown'} (details in {folder / LOG_FILE})"
            )
        return standing(every, tally_in(adapter, folder), read_defaults(folder), read_alike(folder))


def _reused(
    adapter: Adapter,
    target: Any,
    tasks: Sequence[TunerTask],
    folder: Path,
    sources: Sequence[str | Path],
) -> tuple[Sequence[TunerTask], list[str]]:
    """Copy the valid records of ``tasks`` from the work dirs ``sources`` (each tuned with this
    tuner for this target); returns the tasks still to tune and what was reused, in words."""
    done: set[str] = set()
    copied = 0
    for source in map(Path, sources):
        if source.resolve() == folder.resolve():
            raise UsageError(f"--reuse {source} is the --work-dir itself; name other work dirs")
        before = _tuned_before(source) if source.is_dir() else None
        if before is None:
            raise UsageError(f"--reuse {source} is not a relay-tasks work dir (no {TASKS_FILE}); "
                             "name the --work-dir of a tune")  # fmt: skip
        if before != (adapter.name, str(target)):
            raise UsageError(f"--reuse {source} holds {before[0]} records for '{before[1]}', and "
                             f"this tune is {adapter.name} for '{target}'; records are reused "
                             "between work dirs of one tuner and target")  # fmt: skip
        copied += adapter.adopt(tasks, source, folder)
        done |= {r.task.key for r in standing(tasks, tally_in(adapter, source)).tasks
                 if r.valid}  # fmt: skip
    left = [t for t in tasks if t.key not in done]
    said = []
    if done:
        said.append(f"reusing the records of {len(done)} of {len(tasks)} tasks ({copied} copied); "
                    "they are not tuned again")  # fmt: skip
    return left, said


def _similar(
    adapter: Adapter,
    tasks: Sequence[TunerTask],
    records: Tally,
    sources: Sequence[str | Path],
) -> list[str]:
    """How many of ``tasks`` start from the schedules of similar tasks tuned in the work dirs
    ``sources``, in words; a task with ``records`` of its own (a tune resumed) goes on from
    them instead."""
    measured = records.measured()
    fresh = [t for t in tasks if t.key not in measured]
    # The sources' tasks are read only by a tuner that starts from similar tasks.
    similar = adapter.similar(fresh, partial(tuned_in, sources)) if fresh and sources else 0
    return _starting(similar, tasks, "the best schedules of similar tasks tuned there")


def _seeded(adapter: Adapter, tasks: Sequence[TunerTask], records: Tally, target: Any
             ) -> list[str]:  # fmt: skip
    """How many of ``tasks`` (those with no records yet) start from the schedules shipped for
    ``target``'s CPU family, in words."""
    measured = records.measured()
    seeded = adapter.seeded([t for t in tasks if t.key not in measured], target)
    return _starting(seeded, tasks, "schedules relay-tasks ships for this CPU family, measured "
                     "here first (--no-seeds: without them)")  # fmt: skip


def _starting(count: int, tasks: Sequence[TunerTask], whence: str) -> list[str]:
    """``count`` of ``tasks`` start from ``whence``, in words (nothing for none)."""
    if not count:
        return []
    verb = "starts" if count == 1 else "start"
    return [f"{count} of {len(tasks)} task{'s' * (len(tasks) > 1)} to tune {verb} from {whence}"]


def tuned_in(work_dirs: Sequence[str | Path]) -> list[Tuned]:
    """The tasks every tune of each of ``work_dirs`` tuned (:func:`tasks_in`), each with it."""
    return [Tuned(t, Path(w)) for w in work_dirs for t in tasks_in(w).tasks]


def file_tasks(folder: Path, document: dict[str, Any]) -> None:
    """Keep a tune's task file as the work dir's last (``tasks.json``) and as its models' in
    ``tunes/`` (called holding the lock). A tune of models that include all of an earlier
    tune's replaces that one's file: the work dir's tasks count each model once."""
    text = dumps(document) + "\n"
    write_file(folder / TASKS_FILE, text)
    tunes = folder / TUNES_DIR
    if tunes.is_symlink() or (tunes.exists() and not tunes.is_dir()):
        raise TuningError(f"{tunes} is not a directory; remove it (a work dir's task files are "
                          "written only inside it)")  # fmt: skip
    tunes.mkdir(exist_ok=True)
    models = document["models"]
    name = hashlib.sha256("\0".join(models).encode()).hexdigest()[:16] + ".json"
    for older in tunes.glob("*.json"):
        if older.name != name and _models_of(older) <= set(models):
            older.unlink()
    write_file(tunes / name, text)


def tasks_in(work_dir: str | Path) -> TaskFile:
    """What every tune of ``work_dir`` tuned, as one task list: equal tasks merged, weights
    added, each naming the models it serves (the last tune's, for a work dir from before
    ``tunes/``)."""
    last = tuned_for(work_dir)
    files = sorted((Path(work_dir) / TUNES_DIR).glob("*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        return last
    loaded = [load_tasks(path) for path in files]
    for path, tuned in zip(files, loaded, strict=True):
        if (tuned.tuner, str(tuned.target)) != (last.tuner, str(last.target)):
            raise ModelError(f"{path}: tasks of {tuned.tuner} for '{tuned.target}' in a work dir "
                             f"of {last.tuner} for '{last.target}'; remove the file")  # fmt: skip
    models = tuple(dict.fromkeys(m for f in loaded for m in f.models))
    tasks = merge_equal(get_adapter(last.tuner), [t for f in loaded for t in f.tasks])
    return TaskFile(last.tuner, last.target, models, tasks)


def _models_of(path: Path) -> set[str]:
    """The models a task file names (read only to compare names; nothing else of it is)."""
    try:
        models = json.loads(read_regular(path, follow=True) or b"{}").get("models")
    except (ModelError, UnicodeDecodeError, ValueError, RecursionError, AttributeError):
        return set()
    return {m for m in models if isinstance(m, str)} if isinstance(models, list) else set()


def tuned_for(work_dir: str | Path) -> TaskFile:
    """The task file a tune left in ``work_dir``: what it tuned, with which tuner, for which
    target (what ``status`` and ``compile`` read)."""
    folder = Path(work_dir)
    finish_prune(folder)
    if not os.path.lexists(folder / TASKS_FILE):  # what else it is, load_tasks says
        raise UsageError(f"{folder} is not a relay-tasks work dir (no {TASKS_FILE}); "
                         "give the --work-dir of a tune")  # fmt: skip
    return load_tasks(folder / TASKS_FILE)


def check_same_tuning(folder: Path, adapter: Adapter, target: Any) -> None:
    """A work dir keeps one tuner's records for one target: records for another CPU would count
    toward this budget and be built into this target's library, and another tuner's would be
    ignored without a word. Several models may share it (records of equal tasks are reused)."""
    foreign = [name for other in ADAPTERS.values() if other.name != adapter.name
               for name in other.logs if (folder / name).exists()]  # fmt: skip
    before = _tuned_before(folder)
    if before is not None and before != (adapter.name, str(target)):
        holds = f"{before[0]} records for '{before[1]}'"
    elif foreign:
        holds = f"{foreign[0]}, another tuner's records"
    else:
        return
    raise UsageError(
        f"{folder} holds {holds}, and this tune is {adapter.name} for '{target}'; "
        "give another --work-dir (a work dir keeps one tuner's records for one target)"
    )


def _tuned_before(folder: Path) -> tuple[str, str] | None:
    """The tuner and target of the last tune in ``folder`` (its task file's header)."""
    path = folder / TASKS_FILE
    try:
        text = read_regular(path, follow=True)  # never waits on a FIFO in its place
        if text is None:
            return None
        document = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ModelError(f"{path}: cannot read the work dir's task file ({err}); restore it, or "
                         "give another --work-dir") from err  # fmt: skip
    tuner = document.get("tuner") if isinstance(document, dict) else None
    target = document.get("target") if isinstance(document, dict) else None
    if not isinstance(tuner, str) or not isinstance(target, str):
        raise ModelError(f"{path}: not a relay-tasks task file; give another --work-dir")
    return tuner, target


def _resuming(before: Standing, folder: Path) -> str:
    started = sum(1 for t in before.tasks if t.valid)
    return (f"relay-tasks: resuming: {started} of {len(before.tasks)} tasks already have valid "
            f"records in {folder} ({before.valid} valid measurements)")  # fmt: skip


def write_file(path: Path, text: str) -> None:
    """Replace ``path`` whole (a crash leaves the old file or the new one, never half of one;
    a symbolic link there is replaced, not followed), or say in one line why it cannot be."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "x") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except OSError as err:
        with suppress(OSError):
            temporary.unlink()
        raise TuningError(f"cannot write {path}: {err.strerror}") from err


def work_folder(work_dir: str | Path) -> Path:
    folder = Path(work_dir)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--work-dir {folder} is a file; give a directory (it is created)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create --work-dir {folder}: {err.strerror}") from err
    return folder


def parse_tracker(address: str | None, key: str | None) -> tuple[str, int] | None:
    """``--rpc-tracker`` and ``--rpc-key``: both or neither."""
    if address is None:
        if key is not None:
            raise UsageError("--rpc-key needs --rpc-tracker HOST:PORT")
        return None
    return parse_address(address, key, ("--rpc-tracker", "--rpc-key"))


def parse_address(
    address: str, key: str | None, spelled: tuple[str, str] = ("--tracker", "--key")
) -> tuple[str, int]:
    """A tracker's ``HOST:PORT``, the error naming the options as the command spells them."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or key is None:
        option, key_option = spelled
        raise UsageError(
            f"cannot use RPC tracker {address!r}: give {option} HOST:PORT and {key_option} KEY"
        )
    return host, int(port)


def _models(tasks: Sequence[TunerTask]) -> list[str]:
    return list(dict.fromkeys(m for t in tasks for m in t.models))


def _run_worker(
    adapter: Adapter,
    tasks: Sequence[TunerTask],
    folder: Path,
    trials: int | None,
    runner: Runner,
    document: dict[str, Any],
    display: _Progress,
    reuse: Sequence[str | Path] = (),
    deadline: float | None = None,
    seeds: bool = True,
) -> int | None:
    """Run the worker to the end, or until a signal (returns that signal's number) or the
    ``deadline`` (a ``time.monotonic()``; returns ``TIME_UP``).

    The worker reads its tasks from its own copy of the task file (another tune may replace
    the work dir's) and stops with this process (it watches its parent). It runs isolated
    (``python -I``: no ``PYTHON*`` variables, no user site, no current directory on its import
    path) in a private, empty scratch directory, as does every process it starts (TVM's
    builders and runners import ``tvm.topi`` without relay-tasks, whose pickle cache then reads
    and writes ``.pkl_memoize_py3`` in their current directory): nothing placed in the work dir
    is imported or unpickled by any of them. The scratch directory is their ``TMPDIR`` too:
    the libraries TVM's builders leave for the runners, which a stopped tune never runs, go
    with it.
    """
    with (
        _open_log(folder / LOG_FILE) as log,
        scratch_dir("worker") as scratch,
        _signals() as stop,
    ):
        own = scratch / TASKS_FILE
        own.write_text(dumps(document) + "\n")
        command = [sys.executable, "-I", "-m", "relay_tasks.tuning.worker", str(folder.resolve()),
                   str(own), json.dumps(trials), json.dumps(asdict(runner)), str(os.getpid()),
                   json.dumps([str(Path(p).resolve()) for p in reuse]),
                   json.dumps(seeds)]  # fmt: skip
        log.write(f"\n=== relay-tasks tune, {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n".encode())
        log.flush()
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 cwd=scratch, env={**os.environ, "TMPDIR": str(scratch)},
                                 start_new_session=True)  # fmt: skip
        watch = _DeviceWatch(runner)
        up = False
        try:
            while child.poll() is None and not stop and not watch.gone():
                up = deadline is not None and time.monotonic() >= deadline
                if up:
                    break
                display.update()
                time.sleep(0.2)
        finally:
            display.finish()
            _stop(child)
    if stop:
        return stop[0]
    if up:
        return TIME_UP
    if watch.problem is not None:
        kept = standing(tasks, tally_in(adapter, folder)).valid
        raise TuningError(f"{watch.problem} for {watch.grace:.0f} s, so the tune stopped; {kept} "
                          f"valid measurements are kept in {folder}: start a server (relay-tasks "
                          "serve) and run the same command to resume")  # fmt: skip
    if child.returncode != 0:
        free = shutil.disk_usage(folder).free
        if free < FULL_DISK:  # TVM's writers fail with anything but "no space" when it is full
            raise TuningError(f"the disk holding {folder} is full ({free} bytes free): free some "
                              "space, then run the same command to resume (what was measured is "
                              "kept)")  # fmt: skip
        if child.returncode < 0:  # no last word: a signal from outside (the OOM killer, kill)
            kept = standing(tasks, tally_in(adapter, folder)).valid
            raise TuningError(
                f"the tuner's process (pid {child.pid}) was killed by "
                f"{_signal_name(-child.returncode)}; {kept} valid measurements are kept in "
                f"{folder}: run the same command again to resume"
            )
        why = _last_failure(folder / LOG_FILE, child.pid, child.returncode)
        raise TuningError(f"{adapter.name} tuning failed: {why} "
                          f"(details in {folder / LOG_FILE})")  # fmt: skip
    return None


class _DeviceWatch:
    """With ``--rpc-tracker``: the tracker asked every few seconds whether a device under the
    key is still registered. Tuners wait for a device for ever; a tune with none left (their
    servers died, or the tracker) for one measurement's timeout plus a margin ends instead."""

    def __init__(self, runner: Runner) -> None:
        self.runner, self.grace = runner, runner.timeout + DEVICE_MARGIN
        self.next_look = time.monotonic() + DEVICE_POLL
        self.seen: str | None = None  # what is wrong now, and since when
        self.since = 0.0
        #: Why the tune was stopped, once it was.
        self.problem: str | None = None

    def gone(self) -> bool:
        if self.runner.tracker is None or time.monotonic() < self.next_look:
            return False
        self.next_look = time.monotonic() + DEVICE_POLL
        seen = devices_left(self.runner.tracker, str(self.runner.key))
        if seen is None or self.seen is None:
            self.seen, self.since = seen, time.monotonic()
        elif time.monotonic() - self.since >= self.grace:
            self.problem = seen
        return self.problem is not None


#: Seconds between two looks at the tracker, and past a measurement's timeout that a tune waits
#: for a device to come back.
DEVICE_POLL = 2.0
DEVICE_MARGIN = 10.0

#: Free bytes below which a failed tune is put down to a full disk.
FULL_DISK = 1 << 20


def _open_log(path: Path) -> BinaryIO:
    """The tuner's log, appended to (never through a symbolic link), or one line why not."""
    try:
        return open_appending(path)
    except OSError as err:
        why = "it is a symbolic link" if err.errno == errno.ELOOP else err.strerror
        raise TuningError(f"cannot write {path}: {why}") from err


@contextmanager
def _signals() -> Iterator[list[int]]:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed), noted instead of raised (signal
    handlers only in the main thread)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for number in previous:
        signal.signal(number, lambda signum, _frame: received.append(signum))
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _stop(child: subprocess.Popen[bytes]) -> None:
    """End the worker and everything it started (builders, runners, local RPC servers)."""
    if child.poll() is None:
        _signal_group(child.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            child.wait(GRACE)
    _signal_group(child.pid, signal.SIGKILL)
    child.wait()


def _signal_group(pid: int, number: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, number)


def _last_failure(log: Path, pid: int, status: int) -> str:
    """The worker's last word (the log is shared with the work dir's other tunes' workers). A
    worker that ended without one (TVM's C++ exited the process) is said to have, since the
    log's last line is then only what TVM was doing."""
    start = 0
    with suppress(OSError):  # the tail: the log gathers every tune's output
        start = max(os.lstat(log).st_size - LOG_TAIL_BYTES, 0)
    data = read_regular(log, offset=start) or b""
    lines = data.decode(errors="replace").splitlines()
    mark = failure_mark(pid)
    marked = [line[len(mark) :] for line in lines if line.startswith(mark)]
    if marked:
        return marked[-1]
    return f"its process (pid {pid}) exited with status {status} without saying why"


#: How much of the end of the log is searched for a worker's last word.
LOG_TAIL_BYTES = 1 << 20


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Progress:
    """Where the tune stands: task i/n, valid measurements of the budget, best latency so far,
    time spent and an estimate of the time left.

    Read from the records as they grow. On a terminal, one line rewritten every second; off
    one (a pipe, a CI log), a line of its own every ``QUIET_INTERVAL`` seconds and whenever the
    tuner moves to another task, so a long tune is never silent and a short one prints nothing.
    ``defaults``: the worker measures the default schedules first (on this machine only).
    """

    def __init__(
        self,
        adapter: Adapter,
        tasks: Sequence[TunerTask],
        folder: Path,
        trials: int | None,
        *,
        since: int = 0,
        defaults: bool = False,
    ) -> None:
        self.adapter, self.tasks, self.folder, self.trials = adapter, tasks, folder, trials
        self.since, self.defaults = since, defaults
        self.terminal = sys.stderr.isatty()
        self.started = time.monotonic()
        self.interval = 1.0 if self.terminal else QUIET_INTERVAL
        self.last = time.monotonic() if not self.terminal else 0.0
        self.width = 0
        self.reader: threading.Thread | None = None
        self.done = threading.Event()
        self.latest: str | None = None  # the reader thread's last line, until printed
        self.took = 0.0  # seconds the reader's last look took
        self.task = ""  # the part of the last line that names the task
        self.deadline: float | None = None  # when the time budget is spent (time.monotonic())

    def update(self) -> None:
        """Print the latest line the reader thread made, if it is time to."""
        if self.reader is None:
            self.reader = threading.Thread(target=self._read, name="relay-tasks-progress",
                                           daemon=True)  # fmt: skip
            self.reader.start()
        line, self.latest = self.latest, None
        if line is None:
            return
        task = line.split(" | ")[0]  # a task's end: the tuner went on to another one
        moved = self.task.startswith("tuning task") and task.startswith("tuning task")
        moved, self.task = moved and task != self.task, task
        if time.monotonic() - self.last < self.interval and not (moved and not self.terminal):
            return
        self.last = time.monotonic()
        if self.terminal:
            self._write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            self._write(f"relay-tasks: {line}\n")

    def _read(self) -> None:
        """The reader thread: the records read again and again, each look at most half of the
        time (a work dir of 20,000 MetaSchedule records takes 20 s to read), so that the
        supervisor's loop never waits on it for a signal or the time budget."""
        while not self.done.wait(max(PROGRESS_POLL, self.took)):
            started = time.monotonic()
            try:
                records = tally_in(self.adapter, self.folder)
                defaults = read_defaults(self.folder)
            except Exception:  # a log being written can be read half-way; try again later
                continue
            groups = {t.alternatives_of for t in self.tasks}
            missing = len(groups - set(defaults)) if self.defaults else 0
            elapsed = time.monotonic() - self.started
            budget = None if self.deadline is None else self.deadline - self.started
            self.latest = progress_line(self.tasks, records, self.trials, since=self.since,
                                        elapsed=elapsed, defaults_missing=missing,
                                        time_budget=budget, defaults=defaults)  # fmt: skip
            self.took = time.monotonic() - started

    def finish(self) -> None:
        """Stop the reader thread and clear the line."""
        self.done.set()
        self.close()

    def say(self, line: str) -> None:
        """A line of its own, above the progress line."""
        self.close()
        self._write(line + "\n")

    def close(self) -> None:
        if self.terminal and self.width:
            self._write("\r" + " " * self.width + "\r")
            self.width = 0

    def _write(self, text: str) -> None:
        """A terminal that closed (SIGHUP) fails every write: the tune still stops cleanly."""
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except OSError:
            self.terminal, self.interval = False, float("inf")


#: Seconds between two progress lines off a terminal.
QUIET_INTERVAL = 30.0
#: Seconds between two looks at the records for the progress line, at least.
PROGRESS_POLL = 1.0


def progress_line(
    tasks: Sequence[TunerTask],
    records: Records,
    trials: int | None,
    *,
    since: int = 0,
    elapsed: float | None = None,
    defaults_missing: int = 0,
    time_budget: float | None = None,
    defaults: Mapping[str, float] | None = None,
) -> str:
    """The progress of a tune that started with ``since`` valid measurements ``elapsed``
    seconds ago. Tuners measure in batches and finish the one under way, so the count can pass
    the budget: the line then says how far, instead of showing more than all of it. The time
    left is the pace so far carried on to the budget, or the ``time_budget``'s rest if sooner.
    The model's estimate takes each task's default schedule until it has a faster record."""
    summed = as_tally(records)
    now = standing(tasks, summed, defaults)
    keys = [t.key for t in tasks]
    current = keys.index(summed.last) if summed.last in keys else 0
    alternatives = len({t.alternatives_of for t in tasks})
    if defaults_missing and now.valid == since:
        parts = [f"measuring the default schedules: {alternatives - defaults_missing}"
                 f"/{alternatives} tasks"]  # fmt: skip
    else:
        count = f"{now.valid} measured"
        if trials is not None:
            count = f"{min(now.valid, trials)}/{trials} measured"
        if trials is not None and now.valid > trials:
            count += f" +{now.valid - trials} in the tuner's last batch"
        if now.failed:
            count += f" ({now.failed} failed)"
        parts = [f"tuning task {current + 1}/{len(tasks)}", count]
        best = now.tasks[current].best
        if now.latency is not None:
            parts.append(f"model ~{now.latency * 1e3:.4g} ms")
        elif best is not None:
            parts.append(f"task best {best * 1e3:.4g} ms")
    if elapsed is not None:
        done = now.valid - since
        rests = [] if time_budget is None else [max(time_budget - elapsed, 0.0)]
        if trials is not None and done > 0 and now.valid < trials:
            rests.append(elapsed / done * (trials - now.valid))
        timing = f"{_duration(elapsed)} elapsed"
        if rests:
            timing += f", ~{_duration(min(rests))} left"
        parts.append(timing)
    return " | ".join(parts)


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: what a person reads at a glance."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
