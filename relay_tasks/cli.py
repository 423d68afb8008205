"""``relay-tasks``: print, export and tune the tasks of one model or several.

stdout carries results only (a table, or JSON with ``--format json``); messages go to stderr.
Every error is one line on stderr and an exit code named by its class, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn

from .adapters import ADAPTERS, TunerTask, get_adapter
from .adapters.meta_schedule import MODULE_EQUALITIES
from .errors import (
    ModelError,
    RelayTasksError,
    RelayTasksWarning,
    TuningInterrupted,
    UsageError,
)
from .loaders import FORMATS
from .loaders.winograd import TUNERS as WINOGRAD_TUNERS
from .loaders.zoo import DEFAULT_MODEL, MODELS
from .table import aligned

EXIT_USAGE = UsageError.exit_code  # argparse's own errors exit 2 too
EXIT_INTERNAL = 70


def _version() -> str:
    """This package's version and the TVM it runs on (read from the installed metadata: no
    import of TVM for it)."""
    from importlib import metadata

    def of(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"relay-tasks {of('relay-tasks')} (hhb-tvm {of('hhb-tvm')})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay-tasks",
        description="Extract TVM tuning tasks from Relay models without compiling them; tune them.",
    )
    parser.add_argument("--version", action="version", version=_version())
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
        "Records go to --work-dir (TVM's output to its tune.log); running again resumes.",
    )
    tune.add_argument("models", nargs="+", metavar="MODEL|TASKS.json")
    _model_options(tune)
    _tuner_options(tune)
    tune.add_argument(
        "--trials",
        type=int,
        help=f"valid measurements in all (default {DEFAULT_TRIALS}, or none with --time)",
    )
    tune.add_argument(
        "--time",
        type=_duration,
        metavar="DURATION",
        help="stop after this much wall-clock time (30m, 1h30m, 90s or seconds), every "
        "finished measurement kept; with --trials, whichever comes first",
    )
    _work_dir_option(tune)
    tune.add_argument(
        "--reuse",
        nargs="+",
        default=[],
        metavar="WORKDIR",
        help="work dirs tuned for other models (same tuner and target): equal tasks take "
        "their records and are not tuned again, a similar task starts from their best "
        "schedules, and under MetaSchedule and Ansor their records also teach the cost model",
    )
    tune.add_argument(
        "--no-seeds",
        dest="seeds",
        action="store_false",
        help="do not start MetaSchedule's tasks from the schedules relay-tasks ships for this "
        "CPU family (without it, a task with no records first measures those of the same or "
        "similar tasks; only what they measure here is kept)",
    )
    _rpc_options(tune)
    tune.add_argument("--timeout", type=float, default=10.0, help="seconds per build and per run")

    status = verbs.add_parser(
        "status",
        help="where tuning stands: per task and the model's estimated latency",
        description="Per task: weight, GFLOP, trials, valid and failed measurements, best latency "
        "and share; then the model latency estimated from the best records. Without MODEL, the "
        "tasks of the last tune in the work dir.",
    )
    status.add_argument("models", nargs="*", metavar="MODEL")
    _model_options(status)
    _work_dir_option(status)
    status.add_argument("--plot", metavar="FILE.png", help="also draw the progress and shares")
    status.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="json: the same per task and in total, for scripts (times in ms)",
    )

    build = verbs.add_parser(
        "compile",
        help="build a model with the records of a work dir and export the library",
        description="Build MODEL with the tuned records in --work-dir (of the tuner and target "
        "it was tuned for), after saying which of its tasks the records cover.",
    )
    build.add_argument("models", nargs=1, metavar="MODEL")
    _model_options(build)
    _work_dir_option(build)
    build.add_argument("-o", "--output", required=True, help="the library to write (.tar or .so)")
    build.add_argument(
        "--benchmark",
        action="store_true",
        help="also build it untuned, run both and print their latencies; where the "
        "untuned build is faster beyond the spread of the repeats, write it instead",
    )
    build.add_argument(
        "--versus",
        choices=("onnxruntime",),
        help="with --benchmark and an ONNX model: also time ONNX Runtime (CPU, all cores) in "
        "the same rounds (pip install 'relay-tasks[versus]')",
    )
    build.add_argument(
        "--profile",
        action="store_true",
        help="also run the library on this machine and print each fused function's calls and "
        "their time inside the model, slowest first (where a tuned model's time goes: tasks "
        "timed alone, as a tune times them, run faster with their weights in cache)",
    )
    build.add_argument(
        "--no-choose",
        action="store_true",
        help="build each task with its fastest record as its tuner timed it alone; without "
        "it, a MetaSchedule work dir's model is also built with each task's second and third "
        "fastest records, each function timed inside the model, and each task built from the "
        "record that ran fastest there (kept in the work dir for the next compile)",
    )
    build.add_argument(
        "--untuned",
        action="store_true",
        help="build even where the records cover none of the model's tasks (TVM's default "
        "schedules throughout); without it, that is an error naming what --work-dir was tuned for",
    )
    _rpc_options(build)

    cut = verbs.add_parser(
        "prune",
        help="keep the best records of each task, drop the rest",
        description="Rewrite the work dir's records keeping, per task, the K fastest valid ones "
        "and the first failure of each cause: what compile applies and a resumed search seeds "
        "from. All files change together or not at all; refused while a tune runs there.",
    )
    _work_dir_option(cut)
    cut.add_argument("--keep", type=int, required=True, metavar="K", help="records per task")

    ship = verbs.add_parser(
        "export",
        help="write the best records of each task in the tuner's own format",
        description="Write the K fastest valid records of each task in --work-dir to OUTPUT in "
        "the tuner's format, for TVM's own readers (tvmc compile --tuning-records, "
        "apply_history_best): an AutoTVM or Ansor log file, a MetaSchedule database folder.",
    )
    _work_dir_option(ship)
    ship.add_argument(
        "-o", "--output", required=True, help="the log file (a folder for MetaSchedule)"
    )
    ship.add_argument(
        "--keep", type=int, default=1, metavar="K", help="records per task (default 1)"
    )

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


def _work_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--work-dir", required=True, help="the tuning records (resumed from)")


def _rpc_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rpc-tracker", metavar="HOST:PORT", help="measure on devices behind a tracker"
    )
    parser.add_argument("--rpc-key", metavar="KEY", help="the device key registered at the tracker")


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-format", choices=FORMATS, help="instead of guessing from the suffix"
    )
    parser.add_argument(
        "--input-shapes",
        action="append",
        help="tvmc's spelling, with an optional dtype: 'data:[1,3,224,224] ids:[1,128]:int64'; "
        "required for PyTorch models (one per input, in input order); once for all models, or "
        "once per model in order",
    )
    parser.add_argument(
        "--params", help="params file (relay.save_param_dict) for a Relay text model"
    )
    parser.add_argument(
        "--exact-math",
        action="store_true",
        help="keep a converted model's exp, erf, tanh and softmax exact (libm) instead of TVM's "
        "approximations (within 3.3e-7, several times faster); the tasks differ, so give it to "
        "tune and compile alike",
    )
    parser.add_argument(
        "--winograd",
        action="store_true",
        help="MetaSchedule and Ansor: compute 3x3 stride-1 convolutions as Winograd F(4x4,3x3) "
        "in NHWC, a quarter of the multiplies (TOPI has no other schedule for them: tune before "
        "compiling); the tasks differ, so give it to tune and compile alike",
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
            verb = {"extract": _extract, "tune": _tune, "status": _status_verb,
                    "compile": _compile, "prune": _prune, "export": _export,
                    "serve": _serve}[args.verb]  # fmt: skip
            return verb(args)
    except TuningInterrupted as err:
        _error_line(f"interrupted: {err}")
        return err.exit_code
    except RelayTasksError as err:
        _error_line(f"error: {err}")
        return err.exit_code
    except KeyboardInterrupt:
        _error_line("interrupted")
        return 130
    except Exception as err:
        lines = str(err).strip().splitlines()
        said = f": {lines[-1]}" if lines else ""  # the last line of a TVM error says what
        _error_line(
            f"internal error: {type(err).__name__}{said} "
            "(please report this with the command you ran)"
        )
        return EXIT_INTERNAL


def run() -> NoReturn:
    """The ``relay-tasks`` command: :func:`main`, then its exit code.

    After ``extract``, the process leaves without freeing what it holds, once its output is
    flushed: tearing down the heaps of TVM and of a loaded PyTorch model took 0.5 s of a 3.5 s
    ``extract llama.pt``, and nothing of an extraction waits on exit (no subprocess, no
    temporary file). The other verbs run subprocesses and their clean-up: they exit as usual.
    """
    argv = sys.argv[1:]
    code = main(argv)
    if argv[:1] == ["extract"]:
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)


def _error_line(text: str) -> None:
    """The one line on stderr; a terminal that closed (the SIGHUP that stopped a tune) cannot
    show it, and the exit code still says what happened."""
    with suppress(OSError):
        print(f"relay-tasks: {text}", file=sys.stderr)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    if args.module_equality:
        if args.tuner != "meta_schedule":
            raise UsageError("--module-equality applies to --tuner meta_schedule only")
        return {"module_equality": args.module_equality}
    return {}


def _target(args: argparse.Namespace) -> Any:
    from .inputs import as_target, host_target

    if not args.target:
        return host_target()
    target = as_target(args.target)
    if target.kind.name == "llvm" and "mtriple" not in target.attrs:
        from .errors import TargetError

        raise TargetError(
            f"--target {args.target!r} names no -mtriple, and hhb-tvm's LLVM then builds "
            f"riscv64 code; for this machine give --target '{host_target()}' (the default), "
            "or add the -mtriple of the device you tune for"
        )
    return target


def _loaded_models(args: argparse.Namespace, sources: Sequence[str]) -> list[tuple[str, Any, Any]]:
    """(name, module, params) per model; ``--input-shapes`` once for all or once per model."""
    from .loaders import load_model, parse_shapes

    given = args.input_shapes or []
    if len(given) not in (0, 1, len(sources)):
        raise UsageError(f"--input-shapes given {len(given)} times for {len(sources)} models: "
                         "give it once (for every model) or once per model, in order")  # fmt: skip
    specs = given * len(sources) if len(given) == 1 else given or [None] * len(sources)
    if args.params and len(sources) > 1:
        raise UsageError("--params names the weights of one Relay model; give one model with it")
    models = []
    for source, spec in zip(sources, specs, strict=True):
        shapes, dtypes = parse_shapes(spec) if spec else (None, None)
        mod, params = load_model(source, params=args.params, model_format=args.model_format,
                                 shapes=shapes, dtypes=dtypes,
                                 exact_math=args.exact_math)  # fmt: skip
        models.append((source, mod, params))
    return models


def _tasks_of_models(args: argparse.Namespace, sources: Sequence[str]) -> list[TunerTask]:
    return _tasks_of(args, _loaded_models(args, sources))


def _as_tuned(args: argparse.Namespace, tuner: str, models: Sequence[Any]) -> list[Any]:
    """The models as ``tuner`` tunes them: with ``--winograd``, their 3x3 stride-1
    convolutions as Winograd ones."""
    if not args.winograd:
        return list(models)
    if tuner not in WINOGRAD_TUNERS:
        raise UsageError(
            f"--winograd applies to --tuner {' or '.join(WINOGRAD_TUNERS)}: TVM schedules "
            f"Winograd convolutions on CPUs for them only, not for {tuner}"
        )
    from .loaders.winograd import winograd_convolutions

    return [(source, *winograd_convolutions(mod, params)) for source, mod, params in models]


def _tasks_of(args: argparse.Namespace, models: Sequence[Any]) -> list[TunerTask]:
    from .api import extract_models

    tuned = _as_tuned(args, args.tuner, models)
    return extract_models(tuned, _target(args), tuner=args.tuner, **_options(args))


def _extract(args: argparse.Namespace) -> int:
    from .export import dumps, tasks_document

    started = time.perf_counter()
    models = _loaded_models(args, args.models)
    loaded = time.perf_counter()
    tasks = _tasks_of(args, models)
    # On stderr whatever it is: the result goes to stdout, and where the time went is worth
    # seeing in a log too (a model file's loading can cost far more than its extraction).
    print(
        f"relay-tasks: {len(tasks)} tasks in {time.perf_counter() - loaded:.2f} s "
        f"(loading the model{'s' if len(models) > 1 else ''}: {loaded - started:.2f} s)",
        file=sys.stderr,
    )
    if args.format == "json":
        document = tasks_document(tasks, tuner=args.tuner, target=_target(args), models=args.models)
        text = dumps(document)
    else:
        from .tuning.status import task_flops

        flops = task_flops(get_adapter(args.tuner), tasks)
        text = format_table(tasks, flops, several=len(args.models) > 1)
    _write(text + "\n", args.output)
    return 0


#: A tune's budget when neither --trials nor --time is given.
DEFAULT_TRIALS = 64
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?\Z")


def _duration(text: str) -> float:
    """Seconds from ``1h30m``, ``30m``, ``90s``, ``2.5m`` or plain seconds."""
    found = _DURATION.match(text.strip())
    if not text.strip() or found is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (write 30m, 1h30m, 90s or 45)")
    hours, minutes, seconds = (float(part or 0) for part in found.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise argparse.ArgumentTypeError(f"the time budget must be more than nothing, got {text!r}")
    return total


def _tune(args: argparse.Namespace) -> int:
    from .export import load_tasks
    from .tuning import tune
    from .tuning.status import format_status, task_flops

    task_files = [m for m in args.models if m.endswith(".json")]
    if task_files:
        if len(args.models) > 1:
            raise UsageError("give either one task file or model files, not both")
        loaded = load_tasks(task_files[0])
        if args.target or args.tuner != loaded.tuner:
            raise UsageError(
                f"{task_files[0]} holds {loaded.tuner} tasks for {loaded.target}; "
                "drop --target and use --tuner " + loaded.tuner
            )
        tasks, target = loaded.tasks, loaded.target
    else:
        tasks, target = _tasks_of_models(args, args.models), _target(args)
    now = tune(
        tasks,
        target,
        tuner=args.tuner,
        trials=DEFAULT_TRIALS if args.trials is None and args.time is None else args.trials,
        time_budget=args.time,
        work_dir=args.work_dir,
        rpc_tracker=args.rpc_tracker,
        rpc_key=args.rpc_key,
        timeout=args.timeout,
        reuse=args.reuse,
        seeds=args.seeds,
    )
    print(format_status(now, task_flops(get_adapter(args.tuner), tasks)))
    _status(f"records in {args.work_dir}; next: relay-tasks status / relay-tasks compile")
    return 0


def _prune(args: argparse.Namespace) -> int:
    from .tuning.prune import prune
    from .tuning.tune import tuned_for

    folder = Path(args.work_dir)
    done = prune(get_adapter(tuned_for(folder).tuner), folder, args.keep)
    print(done.summary(folder))
    return 0


def _export(args: argparse.Namespace) -> int:
    from .tuning.prune import export_best
    from .tuning.tune import tuned_for

    folder = Path(args.work_dir)
    tuner = tuned_for(folder).tuner
    written = export_best(get_adapter(tuner), folder, Path(args.output), args.keep)
    print(f"{written} {tuner} records (the best {args.keep} a task) in {args.output}")
    return 0


def _status_verb(args: argparse.Namespace) -> int:
    from .adapters.index import tally_in
    from .api import extract_models
    from .tuning import standing
    from .tuning.defaults import read_alike, read_defaults
    from .tuning.status import format_status, plot, status_document, task_flops
    from .tuning.tune import tasks_in

    folder = Path(args.work_dir)
    tuned = tasks_in(folder)
    adapter = get_adapter(tuned.tuner)
    if args.models:
        models = _as_tuned(args, tuned.tuner, _loaded_models(args, args.models))
        tasks = extract_models(models, tuned.target, tuner=adapter)
    else:
        tasks = tuned.tasks
    now = standing(tasks, tally_in(adapter, folder), read_defaults(folder), read_alike(folder))
    flops = task_flops(adapter, tasks)
    if args.format == "json":
        document = {
            "tuner": tuned.tuner,
            "target": str(tuned.target),
            **status_document(now, flops),
        }
        print(json.dumps(document, indent=2))
    else:
        print(format_status(now, flops))
    if args.plot:
        # the plot draws the whole history: the one view that reads every record
        plot(
            args.plot,
            now,
            adapter.measurements(folder),
            f"{folder}: {tuned.tuner} for {tuned.target}",
        )
    return 0


def _compile(args: argparse.Namespace) -> int:
    from .adapters.untuned import naive_calls
    from .adapters.verify import runs_here
    from .host import check_runs_here
    from .inputs import host_target
    from .tuning import compile as building
    from .tuning.logs import set_aside_cut_lines
    from .tuning.tune import parse_tracker, tuned_for

    tracker = parse_tracker(args.rpc_tracker, args.rpc_key)
    if tracker and not args.benchmark:
        raise UsageError("--rpc-tracker applies to --benchmark only")
    if args.versus and not args.benchmark:
        raise UsageError("--versus applies to --benchmark only")
    if args.untuned and args.winograd:
        raise UsageError(
            "--untuned builds with TVM's default schedules, and TOPI has none for Winograd "
            "convolutions (they would run unscheduled): drop --winograd"
        )
    if args.versus:
        from .tuning.versus import check_versus

        check_versus(args.versus, args.models[0], remote=bool(tracker))
    building.check_output(args.output)
    ((source, plain, plain_params),) = models = _loaded_models(args, args.models)
    ((_, mod, params),) = _as_tuned(args, tuned_for(args.work_dir).tuner, models)
    chosen = building.plan(mod, params, args.work_dir)
    choosing = not (args.no_choose or tracker) and runs_here(chosen.target)
    chosen = _recalled(chosen, args.work_dir, choosing)
    if args.benchmark and not tracker:
        check_runs_here(chosen.target, doing="benchmark")
    if args.profile and not runs_here(chosen.target):
        raise UsageError(
            f"--profile runs the library on this machine's CPU, which cannot run code for "
            f"'{str(chosen.target).strip()}'; profile a work dir tuned for this CPU "
            f"(--target '{host_target()}')"
        )
    if not chosen.tuned and chosen.tasks and not args.untuned:
        raise UsageError(building.uncovered(source, chosen, args.work_dir))
    set_aside_cut_lines(Path(args.work_dir), chosen.adapter)
    print(f"relay-tasks: {chosen.describe()}", file=sys.stderr)
    with naive_calls() as naive:
        built = building.build(mod, params, args.work_dir, chosen)
    direct: set[Any] = set()
    # A Winograd call no right record covers would run unscheduled (ResNet-18: 61 ms, not 18):
    # its convolution is built direct instead, which can change the functions beside it.
    while naive - direct and args.winograd:
        from .loaders.winograd import winograd_convolutions

        direct |= naive
        mod, params = winograd_convolutions(plain, plain_params, direct=direct)
        chosen = _recalled(building.plan(mod, params, args.work_dir), args.work_dir, choosing)
        with naive_calls() as naive:
            built = building.build(mod, params, args.work_dir, chosen)
    if direct:
        print(f"relay-tasks: built the convolutions of {len(direct)} Winograd call(s) direct: "
              "the build used no record of theirs (none computes right, or none is faster "
              "than TVM's default), and that default is unscheduled", file=sys.stderr)  # fmt: skip
    path = building.export(built.factory, args.output)
    timed = choosing or args.benchmark or args.profile
    inputs = building.random_inputs(plain, plain_params) if timed else {}
    if choosing:  # the library with the fastest records is written: Ctrl-C keeps it
        from .tuning.choose import choose

        first = built
        try:
            chosen, built = choose(mod, params, args.work_dir, chosen, built, inputs)
        except KeyboardInterrupt:
            print(f"relay-tasks: stopped while choosing; {path} holds the build with the "
                  "fastest records (the next compile chooses again)", file=sys.stderr)  # fmt: skip
            raise
        if built is not first:
            building.export(built.factory, args.output)
    factory = built.factory
    if built.unfound:  # TVM warns twice per function without a record: said once here
        print(f"relay-tasks: built {built.unfound // 2 or 1} function(s) without a record, as "
              f"said above (TVM's messages: {Path(args.work_dir) / 'tune.log'})",
              file=sys.stderr)  # fmt: skip
    print(f"{source}: {len(chosen.tuned)}/{len(chosen.tasks)} tasks tuned, library in {path}")
    tuned = None
    if args.benchmark:
        remote = _remote(tracker, args.rpc_key) if tracker else None
        untuned_factory = building.build_untuned(plain, plain_params, chosen.target)
        others = []
        if args.versus:
            from .tuning.versus import OnnxRuntime

            others.append(OnnxRuntime(args.models[0], inputs))
        tuned, untuned, *rest = building.compare([factory, untuned_factory], inputs,
                                                 remote=remote, others=others)  # fmt: skip
        print(building.summary(tuned, untuned))
        if building.slower(tuned, untuned):
            building.export(untuned_factory, args.output)
            print(f"relay-tasks: wrote the untuned build to {path} instead: the records' "
                  "gains, each timed alone, did not hold in the model (a record's blocking "
                  "can add layout conversions between tasks)", file=sys.stderr)  # fmt: skip
        for other, run in zip(others, rest, strict=True):
            print(building.versus(tuned, run, other.name))
    if args.profile:
        timed_here = None if tracker else tuned
        shares = building.profile(factory, inputs)
        print(building.format_profile(shares, timed_here, built.records(chosen)))
    return 0


def _recalled(chosen: Any, work_dir: str, choosing: bool) -> Any:
    """``compile``'s plan with the choice an earlier compile timed in the model, where it
    still holds (and ``choosing``)."""
    from .tuning.choose import recall

    return recall(chosen, work_dir) if choosing else chosen


def _remote(tracker: tuple[str, int], key: str) -> Any:
    from tvm import rpc

    from .errors import TuningError, describe_failure

    try:
        return rpc.connect_tracker(*tracker).request(key, session_timeout=120)
    except Exception as err:
        raise TuningError(
            f"no device {key!r} at tracker {tracker[0]}:{tracker[1]}: {describe_failure(err)}"
        ) from err


def _serve(args: argparse.Namespace) -> int:
    from .rpc import start_server
    from .tuning.tune import parse_address

    server = start_server(parse_address(args.tracker, args.key), args.key, host=args.host,
                          port=args.port)  # fmt: skip
    # SIGTERM ends the server child too (by default it would leave it running, orphaned); set
    # before the line below, which tells whoever waits for it that signals are handled.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        print(f"serving as {args.key!r} at {args.host}:{server.port} for tracker "
              f"{args.tracker} (Ctrl-C stops)", file=sys.stderr)  # fmt: skip
        while True:
            time.sleep(3600)
    finally:
        server.terminate()


def format_table(tasks: list[TunerTask], flops: Sequence[float], *, several: bool = False) -> str:
    """Per task: index, name, weight, GFLOP per call, share of the model's FLOPs (weight x
    GFLOP), anchor op, and the models that use it when there are several."""
    # Alternative implementations of one function (AutoTVM's dense_nopack, dense_pack) count once.
    once: dict[str, float] = {}
    for t, f in zip(tasks, flops, strict=True):  # the larger count, where two count differently
        once[t.alternatives_of] = max(once.get(t.alternatives_of, 0.0), t.weight * f)
    total = sum(once.values())
    header = ("#", "task", "weight", "GFLOP", "share", "anchor op") + (
        ("models",) if several else ()
    )
    rows = [header]
    for i, (t, f) in enumerate(zip(tasks, flops, strict=True)):
        share = f"{t.weight * f / total:.1%}" if total else "-"
        row = (str(i), t.name, str(t.weight), f"{f / 1e9:.4g}", share, t.anchor_op)
        rows.append(row + ((",".join(t.models),) if several else ()))
    return "\n".join(aligned(rows, left={1, 5}))


def _one_line_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """Our own warnings (functions left out, params not bound) as one line each; others keep
    their category."""
    prefix = "warning" if issubclass(category, RelayTasksWarning) else category.__name__
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
    run()
