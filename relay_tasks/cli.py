"""``relay-tasks``: print, export and (later) tune the tasks of a model.

stdout carries results only (a table, or JSON with ``--format json``); messages go to stderr.
Every error is one line on stderr and an exit code named by its class, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from .adapters import ADAPTERS, TunerTask
from .adapters.meta_schedule import MODULE_EQUALITIES
from .errors import RelayTasksError
from .zoo import DEFAULT_MODEL, MODELS

EXIT_USAGE = 2
EXIT_INTERNAL = 70


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay-tasks",
        description="Extract TVM tuning tasks from a Relay model without compiling it.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    ext = verbs.add_parser(
        "extract",
        help="print or export the tasks of a model",
        description="Print or export the tuning tasks of a model.",
    )
    ext.add_argument(
        "model",
        nargs="?",
        default=DEFAULT_MODEL,
        help=f"built-in model ({', '.join(MODELS)}) or Relay text file; default {DEFAULT_MODEL}",
    )
    ext.add_argument("--params", help="params file (relay.save_param_dict) for a Relay text model")
    ext.add_argument("--target", help="TVM target string; default: this machine's CPU")
    ext.add_argument("--tuner", choices=list(ADAPTERS), default="meta_schedule")
    ext.add_argument(
        "--module-equality",
        choices=MODULE_EQUALITIES,
        help="MetaSchedule only: how TIR modules are deduplicated (default structural)",
    )
    ext.add_argument("--format", choices=("table", "json"), default="table")
    ext.add_argument("-o", "--output", help="write the result to this file instead of stdout")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _extract(args)
    except RelayTasksError as err:
        print(f"relay-tasks: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("relay-tasks: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        first = str(err).strip().splitlines()
        print(
            f"relay-tasks: internal error: {type(err).__name__}: {first[-1] if first else ''} "
            "(please report this with the command you ran)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _extract(args: argparse.Namespace) -> int:
    from .api import extract
    from .inputs import as_target, host_target
    from .load import load_model

    target = as_target(args.target) if args.target else host_target()
    mod, params = load_model(args.model, params=args.params)
    options: dict[str, Any] = {}
    if args.module_equality:
        if args.tuner != "meta_schedule":
            raise_usage("--module-equality applies to --tuner meta_schedule only")
        options["module_equality"] = args.module_equality
    started = time.perf_counter()
    tasks = extract(mod, target, params, tuner=args.tuner, **options)
    _status(f"{len(tasks)} tasks in {time.perf_counter() - started:.1f} s")
    if args.format == "json":
        text = json.dumps(tasks_document(args.model, args.tuner, str(target), tasks), indent=2)
    else:
        text = format_table(tasks)
    _write(text + "\n", args.output)
    return 0


def raise_usage(message: str) -> None:
    from .errors import ModelError

    raise ModelError(message)


def tasks_document(model: str, tuner: str, target: str, tasks: list[TunerTask]) -> dict[str, Any]:
    """The JSON form of a task list (the table's columns, plus the target)."""
    return {
        "model": model,
        "tuner": tuner,
        "target": target,
        "tasks": [
            {
                "index": i,
                "name": t.name,
                "weight": t.weight,
                "anchor_op": t.anchor_op,
                "key": t.key,
            }
            for i, t in enumerate(tasks)
        ],
    }


def format_table(tasks: list[TunerTask]) -> str:
    """Index, task name, weight and anchor op, one task a row."""
    rows = [("#", "task", "weight", "anchor op")]
    rows += [(str(i), t.name, str(t.weight), t.anchor_op) for i, t in enumerate(tasks)]
    widths = [max(len(r[c]) for r in rows) for c in range(3)]
    lines = [
        f"{r[0]:>{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}".rstrip()
        for r in rows
    ]
    return "\n".join(lines)


def _status(message: str) -> None:
    if sys.stderr.isatty():
        print(message, file=sys.stderr)


def _write(text: str, output: str | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    try:
        with open(output, "w") as handle:
            handle.write(text)
    except OSError as err:
        from .errors import ModelError

        raise ModelError(f"{output}: cannot write the output file ({err.strerror})") from err


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
