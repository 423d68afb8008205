"""Relay's frontends and pattern tables wait until used, and waiting changes no task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from relay_tasks._deferred import DEFERRED

TESTS = Path(__file__).resolve().parent

#: Extracts every small graph for every tuner and target; prints the tasks and, after that,
#: which deferred modules have still not run. ``{first}`` is what the process imports first.
_EXTRACT_ALL = """
import json, sys
{first}
import relay_tasks
sys.path.insert(0, {tests!r})
from small_graphs import SMALL_GRAPHS, partitioned_for_ccompiler
from zoo import TARGETS
graphs = {{**SMALL_GRAPHS, "ccompiler": partitioned_for_ccompiler}}
tasks = {{}}
for graph, build in graphs.items():
    mod, params = build()
    for target_name, target in TARGETS.items():
        for tuner in ("meta_schedule", "autotvm", "ansor"):
            found = relay_tasks.extract(mod, target, params, tuner=tuner)
            tasks[f"{{graph}} {{target_name}} {{tuner}}"] = [[t.name, t.weight, t.key] for t in found]
waiting = [m for m in {deferred!r} if "__getattr__" in vars(sys.modules[m])]
print(json.dumps({{"tasks": tasks, "waiting": waiting}}))
"""


def _python(code: str) -> str:
    """What a fresh interpreter prints running ``code`` (relay-tasks' import acts once per process)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=TESTS
    )
    return done.stdout


def _extract_all(first: str) -> dict[str, Any]:
    code = _EXTRACT_ALL.format(first=first, tests=str(TESTS), deferred=DEFERRED)
    found: dict[str, Any] = json.loads(_python(code).splitlines()[-1])
    return found


def test_tasks_are_the_same_whether_the_deferred_modules_ran_first_or_never() -> None:
    deferred = _extract_all(first="")
    eager = _extract_all(first="\n".join(f"import {m}" for m in DEFERRED))
    assert deferred["waiting"] == list(DEFERRED)  # extraction never needed them
    assert eager["waiting"] == []
    assert deferred["tasks"] == eager["tasks"]
    assert all(found for row, found in deferred["tasks"].items() if row.endswith("meta_schedule"))


def test_a_deferred_package_runs_when_a_name_in_it_is_first_read() -> None:
    code = (
        "import sys, relay_tasks\n"
        "waiting = lambda: ['__getattr__' in vars(sys.modules[m]) for m in "
        "('tvm.relay.frontend', 'tvm.relay.op.contrib')]\n"
        "print(waiting())\n"
        # a submodule runs alone, once (twice would register its op attributes twice: an error)
        "from tvm.relay.op.contrib.dnnl import make_conv_pattern\n"
        "print(waiting())\n"
        # one frontend alone: its `from . import qnn_torch` reads a submodule, not the package
        "import tvm.relay.frontend.pytorch\n"
        "print(waiting(), 'tvm.relay.frontend.tflite_hhb' in sys.modules)\n"
        "from tvm import relay\n"
        "print(relay.frontend.from_onnx.__name__, waiting())\n"
        "import tvm.relay.frontend.onnx as onnx\n"
        "print(onnx is relay.frontend.onnx, relay.op.contrib.dnnl.make_conv_pattern is make_conv_pattern)\n"
    )
    assert _python(code).splitlines() == [
        "[True, True]",
        "[True, True]",
        "[True, True] False",
        # the frontends' own imports of contrib are of its submodules: contrib still waits
        "from_onnx [False, True]",
        "True True",
    ]


def test_nothing_is_deferred_when_relay_was_imported_first() -> None:
    code = "import sys, tvm.relay, relay_tasks\nprint('__getattr__' in vars(sys.modules['tvm.relay.frontend']))"
    assert _python(code).strip() == "False"
