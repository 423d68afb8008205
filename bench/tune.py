"""Tuning judged by what it buys: upstream's own tuning loops against ``relay-tasks tune``.

For each model, tuner and budget (valid measurements for ours, trials for upstream's loops,
which count failed ones too), each side tunes in a fresh process and a work dir of its own,
the sides alternating which goes first, while this process reads the side's records every 5 s
(relay-tasks' readers: upstream's loops write the same formats) for the model latency they
estimate (each task's best record or, where faster or not measured yet, its default schedule:
its latency as that side's build gives a task without records, measured once here; under
MetaSchedule and Ansor upstream's is the naive schedule x86's dense and batch_matmul strategies
leave for the tuner, ours TOPI's); then one process times every library built, with the
same ``time_evaluator`` settings (``relay_tasks.tuning.compile.compare``: 20 repeats of at
least 50 ms each, taken in 5 rounds that time every build in turn), beside the untuned build.
hhb-tvm does not register the tensor intrinsics MetaSchedule's own x86 rules look up, so
upstream's ``tune_relay`` fails at once on it; the bench registers them first (as relay-tasks
does), as a user of this build would have to.

    python bench/tune.py                                   # dcgan, MetaSchedule, budget 64
    python bench/tune.py --models dcgan resnet-18-112 bert-2 --tuners meta_schedule ansor \\
        --budgets 64 128 256
    python bench/tune.py --models dcgan-4 --reuse-from dcgan --budgets 16 64

``--reuse-from MODEL`` adds a third side, ``reuse``: ours with ``--reuse`` of a work dir where
MODEL was tuned (ours, the same tuner, at the largest budget; once, before, not timed), as a
user tuning a model family reuses the work dir of its first member (``dcgan-4`` is DCGAN at
batch 4: each of its tasks is a task of DCGAN at another shape).

It prints a table and draws, per model and tuner, the estimated latency against tuning wall
time for every run, each run's measured latency where its tuning ended, and the untuned
latency (``--out``/``MODEL-TUNER.png``).

Upstream's loops, as their tutorials run them: MetaSchedule ``relay_integration.tune_relay``
(gradient task scheduler) and ``compile_relay``; AutoTVM ``extract_from_program``, an
``XGBTuner`` per task (``n_trial`` = budget / tasks, capped by its config space, early
stopping at 600 as the tutorial has it) with ``LocalRunner``, then ``apply_history_best``;
Ansor ``extract_tasks`` and its ``TaskScheduler`` (gradient, by weight), then
``ApplyHistoryBest``. On hhb-tvm every measurement of AutoTVM's ``LocalRunner`` fails
(``RUNTIME_DEVICE``: the RPC server it starts cannot load the library its client uploads,
``.so`` or ``.tar``), so upstream's AutoTVM build is its untuned one; the bench runs the loop as
the tutorial has it all the same and prints what it gives. Ours: ``relay-tasks tune`` and
``relay-tasks compile``, each a whole process (Python's start and imports are in our tuning
time, not in upstream's). Tuning time includes each side's task extraction.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TUNERS = ("meta_schedule", "autotvm", "ansor")


def _models(folder: Path) -> dict[str, list[str]]:
    """Each bench model as ``relay-tasks`` arguments: a built-in name, or Relay text and
    params written into ``folder``."""
    from tvm.relay.testing import resnet

    folder.mkdir(parents=True, exist_ok=True)
    from tvm.relay.testing import dcgan

    made = {"dcgan": ["dcgan"], "dcgan-4": _write(folder / "dcgan-4", *dcgan.get_workload(4))}
    resnet18, params = resnet.get_workload(num_layers=18, batch_size=1, image_shape=(3, 112, 112))
    made["resnet-18-112"] = _write(folder / "resnet-18-112", resnet18, params)
    made["bert-2"] = _write(folder / "bert-2", *_bert(2))
    return made


def _write(stem: Path, mod: Any, params: dict[str, Any]) -> list[str]:
    from tvm import relay

    text, weights = stem.with_suffix(".relay"), stem.with_suffix(".params")
    text.write_text(mod.astext(show_meta_data=False))
    weights.write_bytes(relay.save_param_dict(params))
    return [str(text), "--params", str(weights)]


def _bert(layers: int, seq: int = 64, hidden: int = 256, heads: int = 4) -> tuple[Any, Any]:
    """A BERT-like encoder in Relay: attention and a feed-forward block per layer, seeded."""
    import numpy as np
    import tvm
    from tvm import relay

    rng = np.random.default_rng(0)
    params: dict[str, Any] = {}

    def weight(name: str, shape: tuple[int, ...]) -> Any:
        params[name] = tvm.nd.array((rng.standard_normal(shape) * 0.05).astype("float32"))
        return relay.var(name, shape=shape)

    def dense(x: Any, name: str, units: int, width: int) -> Any:
        return relay.nn.bias_add(relay.nn.dense(x, weight(f"{name}_w", (units, width))),
                                 weight(f"{name}_b", (units,)))  # fmt: skip

    def norm(x: Any, name: str) -> Any:
        return relay.nn.layer_norm(
            x, weight(f"{name}_g", (hidden,)), weight(f"{name}_b", (hidden,))
        )

    x = relay.var("input", shape=(seq, hidden))
    h, size = x, hidden // heads
    for i in range(layers):
        q, k, v = (relay.transpose(relay.reshape(dense(h, f"l{i}_{n}", hidden, hidden),
                                                 (seq, heads, size)), (1, 0, 2))
                   for n in "qkv")  # fmt: skip
        scores = relay.nn.softmax(relay.nn.batch_matmul(q, k) * relay.const(size**-0.5))
        context = relay.nn.batch_matmul(scores, relay.transpose(v, (0, 2, 1)))
        merged = relay.reshape(relay.transpose(context, (1, 0, 2)), (seq, hidden))
        h = norm(h + dense(merged, f"l{i}_o", hidden, hidden), f"l{i}_n1")
        up = dense(h, f"l{i}_f1", 4 * hidden, hidden)
        inner = up * relay.const(0.5) * (relay.const(1.0) + relay.erf(up * relay.const(2**-0.5)))
        h = norm(h + dense(inner, f"l{i}_f2", hidden, 4 * hidden), f"l{i}_n2")
    free = relay.analysis.free_vars(h)
    mod = tvm.IRModule.from_expr(relay.Function(free, h))
    return relay.transform.InferType()(mod), params


def _load(arguments: list[str]) -> tuple[Any, Any]:
    from relay_tasks.loaders import load_model

    if len(arguments) == 1:
        return load_model(arguments[0])
    return load_model(arguments[0], params=arguments[2])


def _upstream(tuner: str, arguments: list[str], budget: int, work: Path) -> dict[str, Any]:
    """Runs in a fresh process: upstream's loop, timed, then its build exported."""
    import tvm
    from tvm import relay

    import relay_tasks  # sets the environment (no TopHub download)

    mod, params = _load(arguments)
    target = relay_tasks.host_target()
    started = time.perf_counter()
    if tuner == "meta_schedule":
        import os

        from tvm import meta_schedule as ms

        from relay_tasks.adapters.meta_schedule import register_intrinsics

        # hhb-tvm does not register the tensor intrinsics its own schedule rules look up:
        # tune_relay fails at once ("TensorIntrin 'dot_16x4_vnni' is not registered") without.
        # Those of the target's kind, as relay-tasks imports them.
        register_intrinsics(target)
        ms_target = tvm.target.Target(f"{target} -num-cores {os.cpu_count()}")
        database = ms.relay_integration.tune_relay(
            mod=mod, params=params, target=ms_target, work_dir=str(work),
            max_trials_global=budget,
        )  # fmt: skip
        tuned = time.perf_counter() - started
        library = ms.relay_integration.compile_relay(database, mod, ms_target, params)
        records = [r for r in database.get_all_tuning_records()]
        valid = sum(1 for r in records if r.run_secs and float(r.run_secs[0]) < 1e9)
        failed = len(records) - valid
    elif tuner == "autotvm":
        from tvm import autotvm

        log = work / "autotvm.log"
        tasks = autotvm.task.extract_from_program(mod["main"], target=target, params=params)
        measure = autotvm.measure_option(
            builder=autotvm.LocalBuilder(),
            runner=autotvm.LocalRunner(number=1, repeat=10, min_repeat_ms=0,
                                       enable_cpu_cache_flush=True),
        )  # fmt: skip
        for task in tasks:
            tuner_obj = autotvm.tuner.XGBTuner(task, loss_type="reg")
            tuner_obj.tune(
                n_trial=min(max(1, budget // len(tasks)), len(task.config_space)),
                early_stopping=600,
                measure_option=measure,
                callbacks=[autotvm.callback.log_to_file(str(log))],
            )
        tuned = time.perf_counter() - started
        rows = [json.loads(line)["result"][1] for line in log.read_text().splitlines()] \
            if log.exists() else []  # fmt: skip
        valid, failed = rows.count(0), len(rows) - rows.count(0)
        with autotvm.apply_history_best(str(log)), tvm.transform.PassContext(opt_level=3):
            library = relay.build(mod, target=target, params=params)
    else:
        from tvm import auto_scheduler

        log = work / "ansor.json"
        tasks, weights = auto_scheduler.extract_tasks(mod["main"], params, target)
        scheduler = auto_scheduler.TaskScheduler(tasks, weights)
        scheduler.tune(auto_scheduler.TuningOptions(
            num_measure_trials=budget,
            runner=auto_scheduler.LocalRunner(repeat=10, enable_cpu_cache_flush=True),
            measure_callbacks=[auto_scheduler.RecordToFile(str(log))],
        ))  # fmt: skip
        tuned = time.perf_counter() - started
        rows = [json.loads(line)["r"][1] for line in log.read_text().splitlines()] \
            if log.exists() else []  # fmt: skip
        valid, failed = rows.count(0), len(rows) - rows.count(0)
        config = {"relay.backend.use_auto_scheduler": True}
        with (
            auto_scheduler.ApplyHistoryBest(str(log)),
            tvm.transform.PassContext(opt_level=3, config=config),
        ):
            library = relay.build(mod, target=target, params=params)
    library.export_library(str(work / "model.so"))
    return {"seconds": tuned, "valid": valid, "failed": failed}


def _ours(tuner: str, arguments: list[str], budget: int, work: Path, reuse: tuple[str, ...] = ()
          ) -> dict[str, Any]:  # fmt: skip
    """``relay-tasks tune`` (with ``--reuse`` of the work dirs ``reuse``) then ``compile``, each a
    process of its own, as a user runs them."""
    cli = [sys.executable, "-m", "relay_tasks.cli"]
    started = time.perf_counter()
    _cli([*cli, "tune", *arguments, "--tuner", tuner, "--trials", str(budget), "--work-dir",
          str(work), *(["--reuse", *reuse] if reuse else [])])  # fmt: skip
    tuned = time.perf_counter() - started
    _cli([*cli, "compile", *arguments, "--work-dir", str(work), "-o", str(work / "model.so")])
    from relay_tasks.adapters import get_adapter

    records = get_adapter(tuner).measurements(work)
    valid = sum(1 for m in records if m.valid)
    return {"seconds": tuned, "valid": valid, "failed": len(records) - valid}


def _tasks(tuner: str, arguments: list[str]) -> list[Any]:
    """The model's tasks, extracted here: their weights turn records into an estimate."""
    import relay_tasks

    mod, params = _load(arguments)
    return relay_tasks.extract(mod, relay_tasks.host_target(), params, tuner=tuner)


def _defaults(tuner: str, tasks: list[Any], folder: Path) -> dict[str, float]:
    """Each task's latency without records (the tuner's build of it), measured here once for
    both sides' estimates."""
    import relay_tasks
    from relay_tasks.adapters import get_adapter
    from relay_tasks.tuning.defaults import measure_defaults, read_defaults

    folder.mkdir(parents=True, exist_ok=True)
    measure_defaults(get_adapter(tuner), tasks, relay_tasks.host_target(), folder)
    return read_defaults(folder)


def _upstream_defaults(tuner: str, tasks: list[Any], folder: Path) -> dict[str, float]:
    """Each task's latency as upstream's build gives a task without records (under MetaSchedule
    and Ansor, for x86's dense and batch_matmul, the naive schedule left for the tuner), for
    upstream's estimates; measured here once."""
    import relay_tasks
    from relay_tasks.tuning.defaults import default_seconds, weight_params

    cache = folder / "upstream.json"
    if cache.exists():
        found: dict[str, float] = json.loads(cache.read_text())
        return found
    target = relay_tasks.host_target()
    found = {}
    for task in tasks:
        if task.source is None or task.alternatives_of in found:
            continue
        seconds = default_seconds(
            task.source.func,
            target,
            lambda mod: _upstream_build(tuner, mod, target),
            weights=weight_params(task.source.func, task.source.lowered),
        )
        if seconds is not None:
            found[task.alternatives_of] = seconds
    folder.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(found))
    return found


def _upstream_build(tuner: str, mod: Any, target: Any) -> Any:
    """Upstream's build of ``mod`` with no records, as its loops build."""
    import os

    import tvm
    from tvm import relay

    if tuner == "meta_schedule":
        from tvm import meta_schedule as ms

        ms_target = tvm.target.Target(f"{target} -num-cores {os.cpu_count()}")
        return ms.relay_integration.compile_relay(
            ms.database.MemoryDatabase(), mod, ms_target, None
        )
    config = {"relay.backend.use_auto_scheduler": True} if tuner == "ansor" else {}
    with tvm.transform.PassContext(opt_level=3, config=config):
        return relay.build(mod, target=target)


def _cli(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])


def _latencies(libraries: dict[str, Path], arguments: list[str]) -> dict[str, Any]:
    """Every library of one model timed in one process, with the same settings and inputs,
    interleaved (:func:`relay_tasks.tuning.compile.compare`)."""
    import tvm
    from tvm import relay

    import relay_tasks
    from relay_tasks.tuning.compile import compare, random_inputs

    mod, params = _load(arguments)
    with tempfile.TemporaryDirectory() as folder:
        untuned = Path(folder) / "untuned.so"
        with tvm.transform.PassContext(opt_level=3):
            relay.build(mod, target=relay_tasks.host_target(), params=params).export_library(
                str(untuned)
            )
        inputs = random_inputs(mod, params)
        paths = {"untuned": untuned, **libraries}
        # Every build in turn, round after round: the host's drift falls on all alike.
        timed = compare([tvm.runtime.load_module(str(p)) for p in paths.values()], inputs)
    return {name: [t.seconds, *t.spread] for name, t in zip(paths, timed, strict=True)}


def _child(argv: list[str]) -> None:
    side, tuner, budget, work, arguments = argv[0], argv[1], int(argv[2]), Path(argv[3]), argv[4:]
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # upstream's Ansor scheduler writes total_latency.tsv where it runs
    try:
        if side == "upstream":
            result = _upstream(tuner, arguments, budget, work)
        elif side == "reuse":  # the first argument is the work dir reused
            result = _ours(tuner, arguments[1:], budget, work, reuse=(arguments[0],))
        else:
            result = _ours(tuner, arguments, budget, work)
    except Exception as err:  # a loop that fails on this TVM build: say how
        result = {"error": f"{type(err).__name__}: {str(err).splitlines()[-1][:300]}"}
    print("RESULT " + json.dumps(result), flush=True)


def _side(
    side: str,
    tuner: str,
    budget: int,
    work: Path,
    arguments: list[str],
    tasks: list[Any],
    defaults: dict[str, float],
) -> dict[str, Any]:
    """One side in a fresh process; every ``SAMPLE`` seconds, the model latency its records
    estimate so far (read with relay-tasks' readers: upstream's loops write the same formats)."""
    from relay_tasks.adapters import get_adapter
    from relay_tasks.tuning import standing

    adapter = get_adapter(tuner)
    command = [sys.executable, __file__, "--child", side, tuner, str(budget), str(work), *arguments]
    started = time.perf_counter()
    curve: list[tuple[float, float]] = []
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        while child.poll() is None:
            time.sleep(SAMPLE)
            try:
                estimate = standing(tasks, adapter.measurements(work), defaults).latency
            except Exception:  # a log being written, or a work dir not there yet
                continue
            if estimate is not None:
                curve.append((time.perf_counter() - started, estimate))
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("RESULT ")]
        if not lines:
            tail = (err.read().strip().splitlines() or ["no output"])[-1]
            return {"error": f"the process failed: {tail[:300]}"}
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    result["curve"] = curve
    return result


#: Seconds between two looks at a side's records.
SAMPLE = 5.0


def _plot(path: Path, title: str, rows: list[Any], timed: dict[str, Any]) -> None:
    """Estimated latency against tuning wall time for every run, each run's measured latency
    where its tuning ended, and the untuned latency."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(9, 5))
    for tuner, budget, side, result in rows:
        if "error" in result:
            continue
        label = f"{side} {tuner} {budget}"
        line = None
        if result["curve"]:
            xs, ys = zip(*result["curve"], strict=True)
            (line,) = axes.step(xs, [y * 1e3 for y in ys], where="post", label=f"{label} (est.)")
        measured = timed[f"{tuner}-{budget}-{side}"][0] * 1e3
        axes.plot([result["seconds"]], [measured], "o", color=line.get_color() if line else None,
                  label=f"{label} (measured)")  # fmt: skip
    axes.axhline(timed["untuned"][0] * 1e3, color="grey", linestyle="--", label="untuned")
    axes.set(xlabel="tuning wall time (s)", ylabel="model latency (ms)", title=title)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


#: The bench's models (see :func:`_models`).
MODELS = ("dcgan", "dcgan-4", "resnet-18-112", "bert-2")


def busy_loop() -> float:
    """Seconds of a fixed pure-Python loop: how loaded the machine is, before and after."""
    started = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.perf_counter() - started


def reached(rows: list[Any], tuner: str, side: str = "ours") -> str:
    """When ``side`` (ours, or ours reusing) first estimated upstream's final latency at the
    largest budget (both read the same way), against upstream's wall time to it; the issue's
    goal is half of it."""
    mine = [row for row in rows if row[0] == tuner and "error" not in row[3]]
    upstream = [row for row in mine if row[2] == "upstream" and row[3]["curve"]]
    if not upstream:
        return f"{tuner}: no estimate of upstream's to reach"
    _, budget, _, theirs = max(upstream, key=lambda row: row[1])
    goal, seconds = theirs["curve"][-1][1], theirs["seconds"]
    times = [t for row in mine if row[2] == side for t, v in row[3]["curve"] if v <= goal]
    if not times:
        best = min((v for row in mine if row[2] == side for _, v in row[3]["curve"]),
                   default=float("nan"))  # fmt: skip
        return (f"{tuner}: upstream's final estimate at {budget}, {goal * 1e3:.4g} ms after "
                f"{seconds:.0f} s, not reached ({side} at best {best * 1e3:.4g} ms)")  # fmt: skip
    first = min(times)
    return (f"{tuner}: upstream's final estimate at {budget}, {goal * 1e3:.4g} ms after "
            f"{seconds:.0f} s, reached by {side} after {first:.0f} s "
            f"({first / seconds:.0%} of it)")  # fmt: skip


def _source(args: argparse.Namespace, tuner: str, models: dict[str, list[str]]) -> Path:
    """The work dir of ours' tune of ``--reuse-from`` at the largest budget, tuned once."""
    work: Path = args.out / "runs" / f"source-{args.reuse_from}-{tuner}-{max(args.budgets)}"
    if not (work / "tasks.json").exists():
        started = time.perf_counter()
        _cli([sys.executable, "-m", "relay_tasks.cli", "tune", *models[args.reuse_from], "--tuner",
              tuner, "--trials", str(max(args.budgets)), "--work-dir", str(work)])  # fmt: skip
        print(
            f"reused: {args.reuse_from} tuned by ours ({tuner}, {max(args.budgets)}) in "
            f"{time.perf_counter() - started:.0f} s, in {work}",
            flush=True,
        )
    return work


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["dcgan"])
    parser.add_argument("--tuners", nargs="+", choices=TUNERS, default=["meta_schedule"])
    parser.add_argument("--budgets", nargs="+", type=int, default=[64])
    parser.add_argument(
        "--reuse-from", choices=MODELS, help="add ours with --reuse of a tune of this model"
    )
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "tune-bench")
    return parser


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
        return
    args = build_parser().parse_args()
    args.out = args.out.resolve()  # the children run in their work dirs
    print(f"machine: busy loop {busy_loop():.2f} s before", flush=True)
    models = _models(args.out / "models")
    print("model           tuner          budget  side      tune s  valid  failed  valid/min  "
          "latency ms (middle half)          untuned ms")  # fmt: skip
    for model in args.models:
        libraries: dict[str, Path] = {}
        rows = []
        for tuner in args.tuners:
            tasks = _tasks(tuner, models[model])
            folder = args.out / "defaults" / f"{model}-{tuner}"
            defaults = {"ours": _defaults(tuner, tasks, folder),
                        "upstream": _upstream_defaults(tuner, tasks, folder)}  # fmt: skip
            source = _source(args, tuner, models) if args.reuse_from else None
            for turn, budget in enumerate(args.budgets):
                sides = ["upstream", "ours"] if turn % 2 == 0 else ["ours", "upstream"]
                for side in sides + (["reuse"] if source else []):
                    work = args.out / "runs" / f"{model}-{tuner}-{budget}-{side}"
                    shutil.rmtree(work, ignore_errors=True)
                    given = [str(source), *models[model]] if side == "reuse" else models[model]
                    estimate = defaults["upstream" if side == "upstream" else "ours"]
                    result = _side(side, tuner, budget, work, given, tasks, estimate)
                    rows.append((tuner, budget, side, result))
                    if "error" not in result:
                        libraries[f"{tuner}-{budget}-{side}"] = work / "model.so"
        timed = _latencies(libraries, models[model])
        base = timed["untuned"]
        for tuner in args.tuners:
            mine = [row for row in rows if row[0] == tuner]
            _plot(args.out / f"{model}-{tuner}.png", f"{model}, {tuner}", mine, timed)
        for tuner, budget, side, result in rows:
            head = f"{model:<15} {tuner:<14} {budget:>6}  {side:<8}"
            if "error" in result:
                print(f"{head}  failed: {result['error']}")
                continue
            median, low, high = timed[f"{tuner}-{budget}-{side}"]
            rate = result["valid"] / (result["seconds"] / 60)
            print(f"{head}  {result['seconds']:>6.1f}  {result['valid']:>5}  {result['failed']:>6}"
                  f"  {rate:>9.1f}  {median * 1e3:.4g} ({low * 1e3:.4g}-{high * 1e3:.4g})"
                  f"{'':<10}{base[0] * 1e3:.4g}", flush=True)  # fmt: skip
        for tuner in args.tuners:
            for side in ("ours", "reuse") if args.reuse_from else ("ours",):
                print(f"{model:<15} {reached(rows, tuner, side)}", flush=True)
    print(f"machine: busy loop {busy_loop():.2f} s after")


if __name__ == "__main__":
    main()
