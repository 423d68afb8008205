"""Task lists as JSON: what ``--format json`` prints and what ``tune`` reads back.

Each task carries the table's fields plus a ``payload``: the Relay primitive function it was
lowered from, as plain data (see :mod:`relay_tasks.adapters.functions`), and for AutoTVM the
template's name. Extraction and tuning can run on different machines: the machine that reads
the file lowers each function again, as extraction does, so what gets compiled is derived there
and never taken from the file. Output is deterministic: the same model gives the same bytes in
any process.

A task file is data from another machine: reading one evaluates nothing (no TVMScript, no pickle,
not even TVM's object JSON), checks every field against an allowlist, the file's checksum (so
damage and edits are caught) and, per task, that the task derived here has the task's key.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import select
import signal
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tvm.target import Target

from .adapters import ADAPTERS, Adapter, TunerTask, get_adapter
from .errors import ModelError, describe_failure
from .inputs import as_target
from .sandbox import confine
from .scratch import scratch_dir
from .targets import target_problem

FORMAT = "relay-tasks/3"
#: Formats older releases wrote, and why they are not read.
OLD_FORMATS = {
    "relay-tasks/1": "whose payloads need a code parser to read",
    "relay-tasks/2": "which carried the compiled form of each task instead of its function",
}
HOW_TO_REWRITE = "re-extract it with relay-tasks extract --format json"


@dataclass(frozen=True)
class TaskFile:
    """A task list read back from JSON."""

    tuner: str
    target: Target
    models: tuple[str, ...]
    tasks: list[TunerTask]


def tasks_document(
    tasks: Sequence[TunerTask], *, tuner: str, target: Target, models: Sequence[str]
) -> dict[str, Any]:
    adapter = get_adapter(tuner)
    document = {
        "format": FORMAT,
        "tuner": tuner,
        "target": str(target),
        "models": list(models),
        "tasks": [
            {
                "index": index,
                "name": task.name,
                "weight": task.weight,
                "anchor_op": task.anchor_op,
                "gflop": round(adapter.flops(task.native) / 1e9, 6),
                "key": task.key,
                "models": list(task.models),
                "group": task.group,
                "payload": adapter.encode(task),
            }
            for index, task in enumerate(tasks)
        ],
    }
    return {**document, "sha256": _digest(document)}


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True)


def load_tasks(path: str | Path) -> TaskFile:
    """Read a task list written by ``relay-tasks extract --format json``.

    Any problem with the file (unreadable, not JSON, an old format, a field of the wrong type, a
    checksum or key that does not match) is one :class:`ModelError` naming the file.
    """
    source = Path(path)
    try:
        return _read(json.loads(_bounded_text(source)))
    except (OSError, UnicodeDecodeError) as err:
        raise ModelError(f"{source}: cannot read the task file ({err})") from err
    except json.JSONDecodeError as err:
        raise ModelError(f"{source}: not JSON ({err.msg} at line {err.lineno})") from err
    except RecursionError as err:
        raise ModelError(f"{source}: not a task file (JSON nested too deeply)") from err
    except _Damaged as err:
        raise ModelError(f"{source}: {err}") from None


#: A task file's size at most: ResNet-50's is 0.16 MB, a 2-layer BERT's 0.05 MB.
MAX_FILE_BYTES = 64 << 20


def _bounded_text(source: Path) -> str:
    """The file's text, refused before it is read when it is no regular file (a FIFO would
    wait for ever) or larger than any task file."""
    fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO's open would wait for a writer
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _Damaged("not a regular file; give the task file itself")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise _Damaged(f"larger than {MAX_FILE_BYTES:,} bytes, which no task file is")
    return data.decode("utf-8")


class _Damaged(Exception):
    """What is wrong with a task file, before the file's name is put in front."""


def _read(document: Any) -> TaskFile:
    if not isinstance(document, dict) or not isinstance(document.get("format"), str):
        raise _Damaged(f'not a relay-tasks task file (no "format": "{FORMAT}"); {HOW_TO_REWRITE}')
    if document["format"] in OLD_FORMATS:
        old = document["format"]
        raise _Damaged(f"written by an older relay-tasks (format {old}, {OLD_FORMATS[old]}); "
                       f"{HOW_TO_REWRITE}")  # fmt: skip
    if document["format"] != FORMAT:
        raise _Damaged(f"unknown task file format {document['format']!r} (this relay-tasks "
                       f"reads {FORMAT}); {HOW_TO_REWRITE}")  # fmt: skip
    _check_fields(document, _DOCUMENT, "the file")
    for index, entry in enumerate(document["tasks"]):
        _check_fields(entry, _TASK, f"task {index}")
        if entry["index"] != index:
            raise _Damaged(f"task {index} says it is task {entry['index']} (tasks were moved)")
        if entry["weight"] < 1:
            raise _Damaged(f"task {index}: weight {entry['weight']} (a task is used at least once)")
    if document["sha256"] != _digest(document):
        raise _Damaged(
            f"changed since it was written (its sha256 does not match); {HOW_TO_REWRITE}"
        )
    if document["tuner"] not in ADAPTERS:
        raise _Damaged(f"unknown tuner {document['tuner']!r}")
    adapter = get_adapter(document["tuner"])
    problem = target_problem(document["target"])
    if problem is not None:
        raise _Damaged(f"{problem}; {HOW_TO_REWRITE}")
    target = as_target(document["target"])

    def derive(report: Callable[[int], None] = lambda index: None) -> list[TunerTask]:
        tasks = []
        for index, entry in enumerate(document["tasks"]):
            report(index)
            tasks.append(_task(adapter, entry, target, index))
        return tasks

    failed = _crash_in_a_child(derive)
    if failed is not None:
        index, what = failed
        entry = document["tasks"][index]
        raise _Damaged(
            f"task {index} ({entry['name']}): its function {what}: no extraction writes such a "
            f"function; {HOW_TO_REWRITE}"
        )
    return TaskFile(adapter.name, target, tuple(document["models"]), derive())


def _crash_in_a_child(derive: Callable[[Callable[[int], None]], object]) -> tuple[int, str] | None:
    """Derive the tasks first in a forked child, confined (:mod:`relay_tasks.sandbox`): TVM's
    type relations and computes assume well-formed calls, and some crash the process on a call
    no extraction makes (an attribute left at a default it never has, a tensor where a tuple
    belongs). The function is checked against an allowlist before, but only TVM itself knows
    what each operator accepts; nor does it bound how long a computation's lowering takes, or
    how much memory it takes. Returns the index of the task the child died on (or spent
    :data:`LOWERING_SECONDS` on) with what happened, or None if it finished (then the same
    work, deterministic, is done here: tasks are TVM objects, which no child can hand back as
    data, so this child is a proving ground, not a wall)."""
    with scratch_dir("sandbox") as scratch:
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: confined, quiet, and gone without running any exit handler
            os.close(reader)
            faulthandler.disable()  # a crash here is the answer, not something to report
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            confine(scratch)

            def report(index: int) -> None:
                os.write(writer, index.to_bytes(4, "little"))

            try:
                derive(report)
            finally:
                os._exit(0)
        os.close(writer)
        reached = b""
        with os.fdopen(reader, "rb", buffering=0) as progress:
            while chunk := _next_report(progress, pid):
                reached += chunk
        index = int.from_bytes(reached[-4:], "little") if len(reached) >= 4 else 0
        _, status = os.waitpid(pid, 0)
    if chunk is None:
        return index, f"takes TVM more than {LOWERING_SECONDS:g} s to lower"
    if os.WIFSIGNALED(status):
        return index, f"crashes TVM when lowered ({signal.Signals(os.WTERMSIG(status)).name})"
    return None


#: How long the lowering of one task may take (real ones take milliseconds, a few seconds for
#: an AutoTVM template with a large config space).
LOWERING_SECONDS = 120.0


def _next_report(progress: Any, pid: int) -> bytes | None:
    """The child's next report (b"" once it has exited); None, the child killed, when it has
    said nothing for :data:`LOWERING_SECONDS`."""
    ready, _, _ = select.select([progress], [], [], LOWERING_SECONDS)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        return None
    chunk: bytes = progress.read(4096)
    return chunk


def _task(adapter: Adapter, entry: dict[str, Any], target: Target, index: int) -> TunerTask:
    where = f"task {index} ({entry['name']})"
    try:
        native, source = adapter.decode(entry["payload"], target, entry["name"], entry["weight"])
        key = adapter.key(native)
    except Exception as err:  # a damaged payload can fail anywhere inside TVM's reader
        raise _Damaged(f"{where}: its payload cannot be read ({describe_failure(err)})") from err
    if key != entry["key"]:
        raise _Damaged(f"{where}: its function is not the task its key names "
                       f"(key {entry['key']}, derived here {key}); {HOW_TO_REWRITE}")  # fmt: skip
    models = tuple(entry["models"])
    group = entry.get("group", "")  # files written before groups were kept have none
    if not isinstance(group, str):
        raise _Damaged(f'{where}: "group" is not a string')
    return TunerTask(
        entry["name"], entry["weight"], entry["anchor_op"], key, native, models, group, source
    )


_STRINGS = (
    "a list of strings",
    lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
)
_DOCUMENT = {
    "tuner": ("a string", lambda v: isinstance(v, str)),
    "target": ("a string", lambda v: isinstance(v, str)),
    "models": _STRINGS,
    "tasks": ("a list", lambda v: isinstance(v, list)),
    "sha256": ("a string", lambda v: isinstance(v, str)),
}
_TASK = {
    "index": ("an integer", lambda v: type(v) is int),
    "name": ("a string", lambda v: isinstance(v, str)),
    "weight": ("an integer", lambda v: type(v) is int),
    "anchor_op": ("a string", lambda v: isinstance(v, str)),
    "gflop": ("a number", lambda v: type(v) in (int, float) and v >= 0),
    "key": ("a string", lambda v: isinstance(v, str)),
    "models": _STRINGS,
    "payload": ("an object", lambda v: isinstance(v, dict)),
}


def _check_fields(
    value: Any, spec: dict[str, tuple[str, Callable[[Any], bool]]], where: str
) -> None:
    if not isinstance(value, dict):
        raise _Damaged(f"{where} is not a JSON object")
    for name, (kind, valid) in spec.items():
        if name not in value:
            raise _Damaged(f'{where} has no "{name}"; {HOW_TO_REWRITE}')
        if not valid(value[name]):
            raise _Damaged(f'{where}: "{name}" is not {kind}')


def _digest(document: dict[str, Any]) -> str:
    """sha256 over the canonical JSON of everything but the digest itself."""
    content = {name: value for name, value in document.items() if name != "sha256"}
    return hashlib.sha256(
        json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
