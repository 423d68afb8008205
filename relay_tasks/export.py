"""Task lists as JSON: what ``--format json`` prints and what ``tune`` reads back.

Each task carries the table's fields plus a ``payload`` from which its tuner rebuilds the native
task (a serialised TIR module, an AutoTVM template and its arguments, an Ansor workload), so
extraction and tuning can run on different machines. Output is deterministic: the same model
gives the same bytes in any process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tvm.target import Target

from .adapters import TunerTask, get_adapter
from .errors import ModelError
from .inputs import as_target

FORMAT = "relay-tasks/1"


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
    return {
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
                "key": task.key,
                "models": list(task.models),
                "payload": adapter.encode(task.native),
            }
            for index, task in enumerate(tasks)
        ],
    }


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True)


def load_tasks(path: str | Path) -> TaskFile:
    """Read a task list written by ``relay-tasks extract --format json``."""
    source = Path(path)
    try:
        document = json.loads(source.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ModelError(f"{source}: cannot read the task file ({err})") from err
    except json.JSONDecodeError as err:
        raise ModelError(f"{source}: not JSON ({err.msg} at line {err.lineno})") from err
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ModelError(
            f'{source}: not a relay-tasks task file (expected "format": "{FORMAT}"); '
            "write one with relay-tasks extract --format json"
        )
    adapter = get_adapter(document["tuner"])
    target = as_target(document["target"])
    try:
        tasks = [
            TunerTask(
                name=entry["name"],
                weight=int(entry["weight"]),
                anchor_op=entry["anchor_op"],
                key=entry["key"],
                native=adapter.decode(entry["payload"], target),
                models=tuple(entry.get("models", ())),
            )
            for entry in document["tasks"]
        ]
    except (KeyError, TypeError, ValueError) as err:
        raise ModelError(f"{source}: a task entry is incomplete or damaged ({err!r})") from err
    return TaskFile(adapter.name, target, tuple(document.get("models", ())), tasks)
