"""What every tuner adapter provides, so that front ends treat the three tuners alike."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ModelError, describe_text
from ..files import read_lines
from ..lowering.extract import Task


@dataclass(frozen=True)
class TunerTask:
    """One task of one tuner: its native object plus the fields every front end shows.

    ``native`` is what the tuner itself consumes (a MetaSchedule ``ExtractedTask``, an AutoTVM
    ``Task`` or an Ansor ``SearchTask``); ``key`` identifies it across models and processes (two
    tasks with the same key and target are the same tuning problem); ``models`` names the models
    that use it. Tasks with the same non-empty ``group`` are alternative implementations of one
    primitive function (AutoTVM's ``dense_nopack`` and ``dense_pack``): the build runs one of
    them, so an estimate of the model counts the best of them once. ``source`` is the shared
    task (primitive function and its lowering) the native task was made from: what a task file
    carries, so that the machine that tunes derives the native task again.
    """

    name: str
    weight: int
    anchor_op: str
    key: str
    native: Any
    models: tuple[str, ...] = ()
    group: str = ""
    source: Task | None = field(default=None, repr=False, compare=False)

    @property
    def alternatives_of(self) -> str:
        """What this task is one way of computing: its group, or itself."""
        return self.group or self.key


@dataclass(frozen=True)
class Measurement:
    """One measurement in a tuner's records: which task, its latency (None if it failed), why."""

    key: str
    seconds: float | None
    error: str = ""
    at: float | None = None  # when it was measured (Unix time), where the records say

    @property
    def valid(self) -> bool:
        """A measurement counts when it ran and gave a finite latency (tuners log failures as
        1e9 or 1e10 s, or not at all)."""
        s = self.seconds
        return s is not None and 0 < s < 1e9


class Line(NamedTuple):
    """One record line of a log: its number (from 1), the byte it starts at, its text, its
    JSON value, and the byte after its newline (None for a last line without one)."""

    number: int
    offset: int
    text: str
    value: Any
    end: int | None = None


@dataclass(frozen=True)
class Tuned:
    """A task tuned for another model, and the work dir its records are in (this tune's own,
    which several models may share, or one ``--reuse`` names)."""

    task: TunerTask
    work_dir: Path


@dataclass(frozen=True)
class Runner:
    """Where measurements run: on this machine, or on devices behind a TVM RPC tracker."""

    tracker: tuple[str, int] | None = None
    key: str | None = None
    timeout: float = 10.0


#: Seconds an RPC measurement gets past ``--timeout`` to connect through the tracker and upload
#: (MetaSchedule's and Ansor's RPC runners bound none: a server that stops answering but stays
#: registered held the tune for ever).
SESSION_MARGIN = 20


class Timing(NamedTuple):
    """How MetaSchedule and Ansor time a candidate: TVM's ``time_evaluator`` settings."""

    number: int
    repeat: int
    min_repeat_ms: int


#: Three repeats of at least 20 ms, the first call's count grown until one repeat lasts that
#: long. Both tuners' default, one repeat of at least 100 ms, cost 0.11-0.28 s a candidate on
#: BERT-2's kernels (its count grows past the 100 ms by up to 1.6x, and often twice): half of
#: a 10-minute tune went to timing. These cost 0.06-0.12 s, and their means spread no more
#: over six timings (0.8-3.3%; the default's 1.7-11.7%). AutoTVM times four calls three times,
#: as its own default.
TIMING = Timing(number=1, repeat=3, min_repeat_ms=20)


class RecordFiles(NamedTuple):
    """The files of a work dir matched line by line: the records, the causes of the failed
    ones (one line a failure, in order), and when each record was measured (where the records
    do not say); and the file whose lines the records name their tasks by, where they do
    (MetaSchedule's workloads), which is only ever appended to."""

    records: str
    causes: str
    times: str = ""
    workloads: str = ""

    @property
    def matched(self) -> tuple[str, ...]:
        """The files matched line by line (what a prune rewrites together)."""
        return tuple(name for name in (self.records, self.causes, self.times) if name)


#: The files of an adapter that keeps no records.
NO_FILES = RecordFiles("", "")


@dataclass(frozen=True)
class Adapter:
    """A tuner reachable through the shared backend.

    - ``extract(mod, target, params=None, **options)``: :class:`TunerTask` rows, upstream order;
    - ``encode(task)`` / ``decode(payload, target, name, weight)``: a task to and from plain
      data, its primitive function (see :mod:`.functions`); decoding lowers that function
      here and returns the native task with its source;
    - ``key(native)``: the task's identity, recomputed from a decoded task to check a task file;
    - ``merge(tasks)``: one task from equal tasks of several models (weights added);
    - ``tune(tasks, target, trials, work_dir, runner, defaults, teachers, seeds)``: tune until
      ``work_dir`` holds ``trials`` valid measurements (failed ones are retried, not counted),
      logging as it goes; ``defaults`` are the latencies of the default schedules (by
      ``alternatives_of``), which the allocation of measurements starts from; ``teachers()``
      the tasks tuned for other models (:class:`Tuned`), whose records its cost model may
      learn and its search may start similar tasks from; with ``seeds``, its search may start
      tasks from the schedules shipped for the target's CPU family, where it has any;
    - ``measurements(work_dir)``: the records in ``work_dir``, in the order measured, each
      under its task's key (the records name their tasks; standing() matches them to rows);
    - ``flops(native)``: floating-point operations of one call of the task;
    - ``build(mod, target, params, work_dir, tasks, others=())``: the model built with the best
      records of ``tasks`` (the model's, extracted here) applied; ``others`` are its tasks built
      without records (their functions get TVM's default schedules); where the tuner is told
      which function it schedules, each function built with a record is noted with the
      record's task (:func:`note_function`);
    - ``logs``: the files of ``work_dir`` its records are in, one record a line;
    - ``check(tasks, work_dir)``: refuse, as damaged, a record of ``tasks`` the tuner would
      apply although its search never writes it (checks that need the tasks; the rest are
      ``measurements``'), before any tuner reads the work dir;
    - ``adopt(tasks, source, work_dir)``: copy the valid records of ``tasks`` from the work dir
      ``source`` (tuned for other models) into ``work_dir``, unless already there; how many;
    - ``similar(tasks, tuned)``: how many of ``tasks`` its tune starts from the records of
      similar tasks among ``tuned()`` (:class:`Tuned`), where it does;
    - ``files``: which of ``logs`` hold the records, their failures' causes and their times,
      line by line (what ``prune`` rewrites together);
    - ``read(work_dir, lines)``: the measurement of each record line (:class:`Line`) of
      ``work_dir``'s records, in order, each line checked as any record is; a failure has no
      seconds and, as its error, the tuner's name for it ("" where it names none), to which
      :mod:`.index` joins its cause;
    - ``seeded(tasks, target)``: how many of ``tasks`` its tune starts from the schedules
      shipped for ``target``'s CPU family (0 for a tuner none are shipped for).
    """

    name: str
    extract: Callable[..., list[TunerTask]]
    encode: Callable[[TunerTask], dict[str, Any]] = field(repr=False)
    decode: Callable[[dict[str, Any], Any, str, int], tuple[Any, Task | None]] = field(repr=False)
    key: Callable[[Any], str] = field(repr=False)
    merge: Callable[[Sequence[TunerTask]], Any] = field(repr=False)
    tune: Callable[..., None] = field(repr=False)
    measurements: Callable[[Path], list[Measurement]] = field(repr=False)
    flops: Callable[[Any], float] = field(repr=False)
    build: Callable[..., Any] = field(repr=False)
    logs: tuple[str, ...] = ()
    check: Callable[[Sequence[TunerTask], Path], None] = field(
        default=lambda tasks, work_dir: None, repr=False
    )
    adopt: Callable[[Sequence[TunerTask], Path, Path], int] = field(
        default=lambda tasks, source, work_dir: 0, repr=False
    )
    similar: Callable[[Sequence[TunerTask], Callable[[], Sequence[Tuned]]], int] = field(
        default=lambda tasks, tuned: 0, repr=False
    )
    files: RecordFiles = NO_FILES
    read: Callable[[Path, Iterable[Line]], Iterator[Measurement]] = field(
        default=lambda work_dir, lines: iter(()), repr=False
    )
    seeded: Callable[[Sequence[TunerTask], Any], int] = field(
        default=lambda tasks, target: 0, repr=False
    )


#: What the names of a built library's functions start with (the graph's module name,
#: ``default``); task names lack it.
LIBRARY_PREFIX = "tvmgen_default_"

#: The task key of the record each function a build under way was built with, by the
#: function's name in the library, where the tuner is told: TVM asks MetaSchedule's database
#: for a function by its name, and AutoTVM's and Ansor's dispatch for an operator's workload,
#: which several functions may share.
_NOTED: ContextVar[dict[str, str] | None] = ContextVar("noted", default=None)


@contextmanager
def noting_functions() -> Iterator[dict[str, str]]:
    """A dict the builds in this block fill: function name (less :data:`LIBRARY_PREFIX`)
    to the key of the task whose record it was built with."""
    noted: dict[str, str] = {}
    token = _NOTED.set(noted)
    try:
        yield noted
    finally:
        _NOTED.reset(token)


def note_function(name: str, key: str) -> None:
    """Note that the library's function ``name`` is built with a record of task ``key``;
    names not in the library (an earlier pass asks too, numbered otherwise) are left out."""
    noted = _NOTED.get()
    if noted is not None and name.startswith(LIBRARY_PREFIX):
        noted[name.removeprefix(LIBRARY_PREFIX)] = key


def merge_equal(adapter: Adapter, tasks: Iterable[TunerTask]) -> list[TunerTask]:
    """Equal tasks (same key) of several models as one: weights added, models joined, in the
    order each first appears."""
    groups: dict[str, list[TunerTask]] = {}
    for task in tasks:
        groups.setdefault(task.key, []).append(task)
    return [
        group[0]
        if len(group) == 1
        else replace(
            group[0],
            weight=sum(t.weight for t in group),
            native=adapter.merge(group),
            models=tuple(dict.fromkeys(m for t in group for m in t.models)),
        )
        for group in groups.values()
    ]


def fastest(rows: Iterable[tuple[str, float | None]], keep: int) -> list[int]:
    """Of ``(task key, seconds)`` rows (None: a failure, or a row not wanted), the positions of
    each key's ``keep`` fastest (the earlier of equal ones), in the rows' order: the records a
    build tries, a search seeds from, a prune keeps."""
    by_key: dict[str, list[tuple[float, int]]] = {}
    for position, (key, seconds) in enumerate(rows):
        if seconds is not None:
            by_key.setdefault(key, []).append((seconds, position))
    return sorted(p for ranked in by_key.values() for _, p in sorted(ranked)[:keep])


def record_lines(path: Path) -> list[tuple[int, str]]:
    """The records of a tuner's log, ``(line number, line)``, one JSON record a line.

    A crash while appending (a hard kill, a full disk) cuts the last line: that one is left out
    (``tune`` and ``compile`` set it aside with a warning before the tuner reads the log). A line
    that is not JSON anywhere else is damage no crash makes: one ``ModelError`` naming the file
    and the line.
    """
    return [(line.number, line.text) for line in scan(path)]


def scan(path: Path, offset: int = 0, number: int = 0) -> Iterator[Line]:
    """The record lines of ``path`` from byte ``offset``, the start of line ``number + 1``,
    one at a time, by the rules of :func:`record_lines` (a cut last line is left out, any other
    line that is not JSON is one ``ModelError``)."""
    lines, first = read_lines(path, offset), offset == 0
    for start, data, ended in lines:
        number += 1
        if not data.strip():
            continue
        text = data.decode("utf-8", errors="replace")
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as err:  # RecursionError: nested too deeply
            rest = [later for _, later, _ in lines if later.strip()]
            if not rest:
                return  # the last line, cut by a crash
            if first and not any(map(is_json, rest)):
                raise ModelError(f"{path} is not a log the tuner wrote: none of its lines is a "
                                 "record; restore the file, or remove it to start its records "
                                 "anew") from err  # fmt: skip
            raise damaged(path, number, str(err)) from err
        first = False
        yield Line(number, start, text, value, start + len(data) + 1 if ended else None)


def is_json(line: str | bytes) -> bool:
    """Whether ``line`` is one JSON value (a line nested past Python's reader is not)."""
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def damaged(path: Path, line: int, why: str) -> ModelError:
    """The error for a record that cannot be read, naming where it is and what to do."""
    return ModelError(
        f"{path}, line {line}: not a record the tuner wrote ({why}); remove that line, or "
        "restore the file, and run again"
    )


def failure_cause(error: str) -> str:
    """The line of a builder's or runner's report that says what went wrong (the last one is
    often the command line that failed), at most 300 characters."""
    lines = [line.strip() for line in error.splitlines() if "error" in line.lower()]
    return (lines[-1] if lines else describe_text(error))[:300]


def failure(error: str, cause: str) -> str:
    """A failed measurement as ``status`` shows it: the tuner's error name, then its cause
    where one was kept (a build timeout's exception says nothing)."""
    return f"{error}: {cause}" if cause else error


def cause_lines(causes: Sequence[str]) -> list[str]:
    """The causes of failed measurements as the lines kept for them, one JSON object each, in
    the order the tuner logs the failures: no tuner keeps them with its records (a failure is
    1e9 or 1e10 s). They are appended with their records (:func:`.journal.append`)."""
    return [json.dumps({"error": cause}) for cause in causes]
