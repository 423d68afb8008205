"""``relay-tasks``: print, export and tune the tasks of one model or several.

stdout carries results only (a table, or JSON with ``--format json``); messages go to stderr.
Every error is one line on stderr and an exit code named by its class, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .adapters import ADAPTERS, TunerTask
from .adapters.meta_schedule import MODULE_EQUALITIES
from .errors import ModelError, RelayTasksError, SkippedTaskWarning
from .loaders import FORMATS
from .loaders.zoo import DEFAULT_MODEL, MODELS

EXIT_USAGE = 2
EXIT_INTERNAL = 70


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay-tasks",
        description="Extract TVM tuning tasks from Relay models without compiling them; tune them.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    ext = verbs.add_parser(
        "extract",
        help="print or export the tasks of one or more models",
        description="Print or export the tuning tasks of one or more models (merged).",
    )
    ext.add_argument(
        "models",
        nargs="*",
        default=[DEFAULT_MODEL],
        metavar="MODEL",
        help=f"built-in model ({', '.join(MODELS)}) or a model file (.onnx, .tflite, "
        "TorchScript .pt/.pth/.torchscript, Relay text); "
        f"default {DEFAULT_MODEL}",
    )
    _model_options(ext)
    _tuner_options(ext)
    ext.add_argument("--format", choices=("table", "json"), default="table")
    ext.add_argument("-o", "--output", help="write the result to this file instead of stdout")

    tune = verbs.add_parser(
        "tune",
        help="tune the tasks of models or of a task file",
        description="Tune the tasks of models, or of a task file written by extract --format json. "
        "Logs go to --work-dir; running again resumes from them.",
    )
    tune.add_argument("models", nargs="+", metavar="MODEL|TASKS.json")
    _model_options(tune)
    _tuner_options(tune)
    tune.add_argument("--trials", type=int, default=64, help="measurements in all (default 64)")
    tune.add_argument("--work-dir", required=True, help="tuning logs; reused to resume")
    tune.add_argument(
        "--rpc-tracker", metavar="HOST:PORT", help="measure on devices behind a tracker"
    )
    tune.add_argument("--rpc-key", metavar="KEY", help="the device key registered at the tracker")
    tune.add_argument("--timeout", type=float, default=20.0, help="seconds per measurement")

    serve = verbs.add_parser(
        "serve",
        help="run an RPC server for tune --rpc-tracker on a device",
        description="Run a TVM RPC server registered at a tracker (with hhb-tvm's module loading "
        "fixed), so that tune --rpc-tracker can measure on this machine.",
    )
    serve.add_argument("--tracker", required=True, metavar="HOST:PORT")
    serve.add_argument("--key", required=True, help="the device key to register under")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only); the server runs any "
        "module a client sends, so open it (e.g. --host 0.0.0.0) only on a trusted network",
    )
    serve.add_argument("--port", type=int, default=9090)
    return parser


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-format", choices=FORMATS, help="instead of guessing from the suffix"
    )
    parser.add_argument(
        "--input-shapes",
        help="tvmc's spelling, with an optional dtype: 'data:[1,3,224,224] ids:[1,128]:int64'; "
        "required for PyTorch models (one per input, in input order)",
    )
    parser.add_argument(
        "--params", help="params file (relay.save_param_dict) for a Relay text model"
    )


def _tuner_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="TVM target string; default: this machine's CPU")
    parser.add_argument("--tuner", choices=list(ADAPTERS), default="meta_schedule")
    parser.add_argument(
        "--module-equality",
        choices=MODULE_EQUALITIES,
        help="MetaSchedule only: how TIR modules are deduplicated (default structural)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            return {"extract": _extract, "tune": _tune, "serve": _serve}[args.verb](args)
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


def _options(args: argparse.Namespace) -> dict[str, Any]:
    if args.module_equality:
        if args.tuner != "meta_schedule":
            raise ModelError("--module-equality applies to --tuner meta_schedule only")
        return {"module_equality": args.module_equality}
    return {}


def _target(args: argparse.Namespace) -> Any:
    from .inputs import as_target, host_target

    return as_target(args.target) if args.target else host_target()


def _tasks_of_models(args: argparse.Namespace, sources: Sequence[str]) -> list[TunerTask]:
    from .api import extract_models
    from .loaders import load_model, parse_shapes

    shapes, dtypes = parse_shapes(args.input_shapes) if args.input_shapes else (None, None)
    if args.params and len(sources) > 1:
        raise ModelError("--params names the weights of one Relay model; give one model with it")
    models = [
        (
            source,
            *load_model(
                source,
                params=args.params,
                model_format=args.model_format,
                shapes=shapes,
                dtypes=dtypes,
            ),
        )
        for source in sources
    ]
    return extract_models(models, _target(args), tuner=args.tuner, **_options(args))


def _extract(args: argparse.Namespace) -> int:
    from .export import dumps, tasks_document

    started = time.perf_counter()
    tasks = _tasks_of_models(args, args.models)
    _status(f"{len(tasks)} tasks in {time.perf_counter() - started:.1f} s")
    if args.format == "json":
        document = tasks_document(tasks, tuner=args.tuner, target=_target(args), models=args.models)
        text = dumps(document)
    else:
        text = format_table(tasks, several=len(args.models) > 1)
    _write(text + "\n", args.output)
    return 0


def _tune(args: argparse.Namespace) -> int:
    from .api import tune
    from .export import load_tasks

    task_files = [m for m in args.models if m.endswith(".json")]
    if task_files:
        if len(args.models) > 1:
            raise ModelError("give either one task file or model files, not both")
        loaded = load_tasks(task_files[0])
        if args.target or args.tuner != loaded.tuner:
            raise ModelError(
                f"{task_files[0]} holds {loaded.tuner} tasks for {loaded.target}; "
                "drop --target and use --tuner " + loaded.tuner
            )
        tasks, target = loaded.tasks, loaded.target
    else:
        tasks, target = _tasks_of_models(args, args.models), _target(args)
    logged = tune(
        tasks,
        target,
        tuner=args.tuner,
        trials=args.trials,
        work_dir=args.work_dir,
        rpc_tracker=args.rpc_tracker,
        rpc_key=args.rpc_key,
        timeout=args.timeout,
    )
    print(f"{len(tasks)} tasks, {logged} measurements logged in {Path(args.work_dir)}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .api import parse_tracker
    from .rpc import start_server

    tracker = parse_tracker(args.tracker, args.key)
    if tracker is None:  # pragma: no cover - argparse requires --tracker
        raise ModelError("serve needs --tracker HOST:PORT")
    server = start_server(tracker, args.key, host=args.host, port=args.port)
    print(f"serving as {args.key!r} at {args.host}:{server.port} for tracker "
          f"{args.tracker} (Ctrl-C stops)", file=sys.stderr)  # fmt: skip
    try:
        while True:
            time.sleep(3600)
    finally:
        server.terminate()


def format_table(tasks: list[TunerTask], *, several: bool = False) -> str:
    """Index, task name, weight and anchor op, one task a row (and the models, for several)."""
    header = ("#", "task", "weight", "anchor op") + (("models",) if several else ())
    rows = [header]
    for i, t in enumerate(tasks):
        row = (str(i), t.name, str(t.weight), t.anchor_op)
        rows.append(row + ((",".join(t.models),) if several else ()))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header) - 1)]
    lines = []
    for r in rows:
        cells = [f"{r[0]:>{widths[0]}}", f"{r[1]:<{widths[1]}}", f"{r[2]:>{widths[2]}}"]
        cells += [f"{r[3]:<{widths[3]}}" if several else r[3], *r[4:]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _one_line_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """Our own warnings (functions left out) as one line each; others keep their category."""
    prefix = "warning" if issubclass(category, SkippedTaskWarning) else category.__name__
    print(f"relay-tasks: {prefix}: {message}", file=sys.stderr)


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
        raise ModelError(f"{output}: cannot write the output file ({err.strerror})") from err


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
