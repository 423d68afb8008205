"""``relay-tasks compile``: build a model with the records of a work dir, and time it.

Before building it says which of the model's tasks the records cover and names each that is
not (upstream says so only as a "Cannot find workload" line per miss, during the build).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..adapters import Adapter, TunerTask, get_adapter
from ..adapters.base import LIBRARY_PREFIX, noting_functions
from ..adapters.index import tally_in
from ..adapters.journal import open_appending
from ..adapters.verify import runs_here, seeded_values
from ..errors import ModelError, TuningError, UsageError, describe_failure
from ..loaders.winograd import winograd_tasks
from ..table import aligned
from .defaults import read_alike, read_defaults, record_seconds, stale_defaults
from .records import TaskRecord, standing
from .tune import LOG_FILE, tuned_for


@dataclass(frozen=True)
class Plan:
    """What a build with the records of a work dir will use."""

    adapter: Adapter
    target: Any
    tasks: list[TunerTask]
    tuned: list[TunerTask]
    #: Tasks with records whose best is slower than TVM's default schedule (built with that).
    slower: list[TunerTask] = field(default_factory=list)
    #: Tasks whose default latency an older relay-tasks measured (:mod:`.defaults`).
    stale: list[TunerTask] = field(default_factory=list)
    #: Seconds of each measured task's best record as its tuner timed it, by task key.
    best: dict[str, float] = field(default_factory=dict)
    #: Where the model ran faster with another record than a task's fastest: the rank to
    #: build it from (:mod:`.choose`), by task key.
    ranks: dict[str, int] = field(default_factory=dict)
    #: Whether ``ranks`` is a choice timed in the model on this host.
    in_model: bool = False

    @property
    def missing(self) -> list[TunerTask]:
        return [t for t in self.tasks if t not in self.tuned]

    @property
    def applied(self) -> list[TunerTask]:
        """The tasks built with their records."""
        return [t for t in self.tuned if t not in self.slower]

    def describe(self) -> str:
        line = f"the records cover {len(self.tuned)} of the model's {len(self.tasks)} tasks"
        if self.missing:
            names = ", ".join(t.name for t in self.missing)
            line += f"; not tuned (built with default schedules): {names}"
        if self.slower:
            names = ", ".join(t.name for t in self.slower)
            line += f"; slower than TVM's default schedule (built with it): {names}"
        if self.ranks:
            line += (f"; as timed in the model by an earlier compile, {len(self.ranks)} built "
                     "with another of their fastest records")  # fmt: skip
        if self.stale:
            line += (f"; {len(self.stale)} default latencies were measured by an older "
                     "relay-tasks, its way (`relay-tasks tune` measures them again)")  # fmt: skip
        return line


def plan(mod: Any, params: Any, work_dir: str | Path) -> Plan:
    """The model's tasks for the tuner and target the work dir was tuned for, which of them
    have a valid record there, and which records are slower than the default schedule."""
    tuned = tuned_for(work_dir)
    adapter = get_adapter(tuned.tuner)
    tasks = adapter.extract(mod, tuned.target, params)
    folder = Path(work_dir)
    now = standing(tasks, tally_in(adapter, folder), read_defaults(folder), read_alike(folder))
    adapter.check(tasks, Path(work_dir))
    built = {r.task.alternatives_of for r in now.chosen}  # where a record beats the default
    if runs_here(tuned.target):
        lost = [r for r in now.chosen if _slower_alike(adapter, r, tuned.target, work_dir)]
        built -= {r.task.alternatives_of for r in lost}
    measured = [r.task for r in now.tasks if r.best is not None]
    slower = [t for t in measured if t.alternatives_of not in built]
    old = stale_defaults(Path(work_dir))
    stale = [t for t in measured if t.alternatives_of in old]
    best = {r.task.key: r.best for r in now.tasks if r.best is not None}
    return Plan(adapter, tuned.target, tasks, measured, slower, stale, best)


def uncovered(source: str, chosen: Plan, work_dir: str | Path) -> str:
    """Why a build whose records cover none of the model's tasks is refused: what the work dir
    was tuned for, and the two ways on."""
    tuned = tuned_for(work_dir)
    ways = (f"tune {source} there first (relay-tasks tune {source} --work-dir {work_dir}), or "
            "pass --untuned to build it with TVM's default schedules")  # fmt: skip
    if winograd_tasks(tuned.tasks) and not winograd_tasks(chosen.tasks):
        ways = "its records are of Winograd convolutions: give --winograd, as to tune; or " + ways
    if source in tuned.models:
        return (
            f"{work_dir} holds no valid record of {source}'s {len(chosen.tasks)} tasks yet; {ways}"
        )
    models = ", ".join(tuned.models[:4]) + (" ..." if len(tuned.models) > 4 else "")
    return (
        f"the records in {work_dir} cover none of {source}'s {len(chosen.tasks)} tasks (it was "
        f"tuned for {models or 'no model'}: {tuned.tuner}, '{tuned.target}'); {ways}"
    )


def _slower_alike(adapter: Adapter, row: TaskRecord, target: Any, work_dir: str | Path) -> bool:
    """Whether the task's records, timed here as its default was (:func:`record_seconds`),
    lose to the default after all."""
    if row.default is None or row.best is None:
        return False
    seconds = record_seconds(adapter, row.task, target, Path(work_dir), row.best)
    return seconds is not None and seconds > row.default


@dataclass
class Built:
    """A built library, and what TVM said while building it that relay-tasks says for it."""

    factory: Any
    #: TVM's "Cannot find workload" warnings (one per lowered function without a record).
    unfound: int = 0
    #: The key of the task whose record each function was built with, by function name,
    #: where the tuner says (:func:`..adapters.base.note_function`).
    functions: dict[str, str] = field(default_factory=dict)

    def records(self, chosen: Plan) -> dict[str, float]:
        """Seconds of the best record of each function built with it, by function name."""
        return {
            name: chosen.best[key]
            for name, key in self.functions.items()
            if key not in chosen.ranks
        }


#: TVM's warning, printed twice per task without records (MetaSchedule's database is asked).
_UNFOUND = "Cannot find workload: "


def build(mod: Any, params: Any, work_dir: str | Path, chosen: Plan | None = None) -> Built:
    """The model built with the work dir's records (a graph executor factory module); TVM's
    warnings about functions without records are counted, not printed (the plan said which
    tasks have none), and its raw output goes to the work dir's ``tune.log`` where it can."""
    chosen = chosen or plan(mod, params, work_dir)
    with _tvm_output(Path(work_dir)) as lines, noting_functions() as functions:
        factory = _build(mod, params, work_dir, chosen)
    unfound = [line for line in lines if _UNFOUND in line]
    for line in lines:
        if _UNFOUND not in line:
            print(line, file=sys.stderr)
    return Built(factory, len(unfound), functions)


@contextlib.contextmanager
def _tvm_output(work_dir: Path) -> Iterator[list[str]]:
    """What is written to file descriptor 2 meanwhile (TVM's C++ logs go there, not through
    Python), as lines once it is done; appended whole to ``work_dir``'s log too."""
    sys.stderr.flush()
    lines: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            raw = caught.read()
            lines += raw.decode("utf-8", errors="replace").splitlines()
            with contextlib.suppress(OSError), open_appending(work_dir / LOG_FILE) as log:
                log.write(raw)  # a read-only work dir keeps none


def _build(mod: Any, params: Any, work_dir: str | Path, chosen: Plan) -> Any:
    try:
        applied = chosen.applied
        others = [t for t in chosen.tasks if t not in applied]
        ranked = {"ranks": chosen.ranks} if chosen.ranks else {}  # MetaSchedule's (:mod:`.choose`)
        return chosen.adapter.build(
            mod, chosen.target, params, Path(work_dir), applied, others, **ranked
        )
    except ModelError:  # a damaged record, named where it is
        raise
    except Exception as err:
        raise TuningError(f"building with the records failed: {describe_failure(err)}") from err


def build_untuned(mod: Any, params: Any, target: Any) -> Any:
    """The same model with TVM's default schedules, to compare against."""
    import tvm
    from tvm import relay

    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target, params=params)


def check_output(output: str | Path) -> Path:
    """The library's path, checked before anything is built (a missing folder failed after the
    whole build, quoting tar)."""
    path = Path(output)
    if path.suffix not in (".tar", ".so"):
        raise UsageError(f"-o {path}: name a .tar or .so file")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"-o {path}: there is no folder {folder}; create it, or name another")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"-o {path}: the folder {folder} cannot be written; name another")
    return path


def export(factory: Any, output: str | Path) -> Path:
    """Write the library whole or not at all: to a name of its own beside ``output`` first,
    then renamed (a compile stopped while writing, or while choosing after it wrote the build
    with the fastest records, leaves the library written before, never half of one)."""
    path = check_output(output)
    partial = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")
    try:
        factory.export_library(str(partial))
        os.replace(partial, path)
    except Exception as err:
        raise ModelError(f"{path}: cannot write the library ({describe_failure(err)})") from err
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
    return path


def random_inputs(mod: Any, params: Any) -> dict[str, np.ndarray[Any, Any]]:
    """Seeded inputs for every parameter of ``main`` that the params do not bind."""
    from tvm import relay

    rng = np.random.default_rng(0)
    inputs = {}
    # Frontends hand over untyped modules: the input types come from type inference.
    for var in relay.transform.InferType()(mod)["main"].params:
        if var.name_hint in (params or {}):
            continue
        shape = [int(d) for d in var.checked_type.shape]
        inputs[var.name_hint] = seeded_values(rng, shape, str(var.checked_type.dtype))
    return inputs


@dataclass(frozen=True)
class Run:
    """The model's latency over repeats (seconds each) and its outputs."""

    repeats: list[float]
    outputs: list[np.ndarray[Any, Any]]

    @property
    def seconds(self) -> float:
        return float(np.median(self.repeats))

    @property
    def spread(self) -> tuple[float, float]:
        """The middle half of the repeats (25th to 75th percentile), seconds."""
        low, high = np.percentile(self.repeats, [25, 75])
        return float(low), float(high)


#: Repeats of a benchmark, and the shortest one: TVM's ``time_evaluator`` runs the model as
#: often as a repeat needs to last that long, so a model of microseconds is timed over
#: thousands of runs rather than one (ten single runs of one build measured 0.045-0.46 ms).
REPEATS, MIN_REPEAT_MS = 20, 50


#: Rounds a comparison is timed in, each timing every build in turn: the host's speed drifts
#: by 10% within a minute (ResNet-18 at 112x112: one build timed three times between two
#: others measured 10.7, 12.9 and 10.7 ms, the others with it), and builds timed one after the
#: other carried that drift as a difference between them.
ROUNDS = 5


def compare(
    factories: Sequence[Any],
    inputs: dict[str, np.ndarray[Any, Any]],
    *,
    repeat: int = REPEATS,
    min_repeat_ms: int = MIN_REPEAT_MS,
    remote: Any = None,
    others: Sequence[Any] = (),
) -> list[Run]:
    """Latency of each build's ``repeat`` repeats (after a warm-up), and its outputs, on this
    machine's CPU or on an RPC session's device; the repeats are taken in :data:`ROUNDS` rounds
    that time each build in turn, so that the host's drift falls on all of them alike.
    ``others`` are other runtimes timed in the same rounds, after the builds (objects with
    ``time(count, min_repeat_ms)`` and ``outputs()``, as :class:`.versus.OnnxRuntime`)."""
    graphs = [_graph(f, inputs, remote, f"model{i}.tar") for i, f in enumerate(factories)]
    repeats: list[list[float]] = [[] for _ in [*graphs, *others]]
    rounds = max(1, min(ROUNDS, repeat))
    for number in range(rounds):
        count = repeat // rounds + (1 if number < repeat % rounds else 0)
        for (graph, device), times in zip(graphs, repeats, strict=False):
            timing = graph.benchmark(device, number=1, repeat=count, min_repeat_ms=min_repeat_ms,
                                     end_to_end=False)  # fmt: skip
            times += [float(s) for s in timing.results]
        for other, times in zip(others, repeats[len(graphs) :], strict=True):
            times += other.time(count, min_repeat_ms)
    timed = []
    for (graph, _), times in zip(graphs, repeats, strict=False):
        graph.run()
        outputs = [graph.get_output(i).numpy() for i in range(graph.get_num_outputs())]
        timed.append(Run(times, outputs))
    for other, times in zip(others, repeats[len(graphs) :], strict=True):
        timed.append(Run(times, other.outputs()))
    return timed


def _graph(
    factory: Any, inputs: dict[str, np.ndarray[Any, Any]], remote: Any, name: str
) -> tuple[Any, Any]:
    """A graph executor of ``factory`` with ``inputs`` set, on this CPU or the remote's."""
    import tvm
    from tvm.contrib import graph_executor

    if remote is None:
        device, module = tvm.cpu(0), factory
    else:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / name
            factory.export_library(str(path))
            remote.upload(str(path))
        module, device = remote.load_module(name), remote.cpu(0)
    graph = graph_executor.GraphModule(module["default"](device))
    for key, value in inputs.items():
        graph.set_input(key, value)
    return graph, device


@dataclass(frozen=True)
class Share:
    """One fused function's part of a model's run: its calls and their time in the model."""

    function: str
    calls: int
    seconds: float


#: Runs a profile takes the median of: one run's per-call timers vary by a tenth and more.
PROFILE_RUNS = 15


def profile(factory: Any, inputs: dict[str, np.ndarray[Any, Any]]) -> list[Share]:
    """Each fused function's time inside the model, slowest first: per run, the time of its
    calls added up, timed by TVM's debug executor as the model runs; the median over
    :data:`PROFILE_RUNS` runs.
    A tuner times a candidate alone, over and over, its weights in cache; in the model each
    weight comes from memory once a run (BERT-2's dense layers: 2.6-3.0 ms a call in the model,
    2.1 alone, 1.8 as their records were measured), so these are the figures that say which
    tasks hold a model back."""
    (shares,) = profiles([factory], inputs)
    return shares


def profiles(
    factories: Sequence[Any], inputs: dict[str, np.ndarray[Any, Any]]
) -> list[list[Share]]:
    """:func:`profile` of each build, their runs taken in turn (one run of each a round), so
    that the host's drift falls on all of them alike."""
    import tvm

    debugs = []
    for factory in factories:
        debug = factory["debug_create"]("default", tvm.cpu(0))
        for key, value in inputs.items():
            debug["set_input"](key, tvm.nd.array(value))
        debug["run"]()  # warm-up
        debugs.append(debug)
    seconds: list[dict[str, list[float]]] = [{} for _ in debugs]
    calls: list[dict[str, int]] = [{} for _ in debugs]
    for _ in range(PROFILE_RUNS):
        for debug, times, count in zip(debugs, seconds, calls, strict=True):
            one: dict[str, float] = {}
            count.clear()
            for call in debug["profile"](None).calls:
                name = str(call["Name"]).removeprefix(LIBRARY_PREFIX)  # as task names read
                one[name] = one.get(name, 0.0) + float(call["Duration (us)"].microseconds) * 1e-6
                count[name] = count.get(name, 0) + 1
            for name, total in one.items():
                times.setdefault(name, []).append(total)
    shares = [[Share(name, count[name], float(np.median(t))) for name, t in times.items()]
              for times, count in zip(seconds, calls, strict=True)]  # fmt: skip
    return [sorted(one, key=lambda share: -share.seconds) for one in shares]


def format_profile(
    shares: Sequence[Share], model: Run | None = None, records: Mapping[str, float] | None = None
) -> str:
    """The table :func:`profile` gives, with the model's own latency where it was timed; and
    with ``records`` (seconds by function, :meth:`Built.records`) each function's best record
    beside its calls, and how much slower all those calls ran in the model than their records,
    which is how far ``status``'s estimate is off."""
    records = records or {}
    total = sum(share.seconds for share in shares)
    rows = [["ms in model", "share", "calls", "ms a call"]
            + (["record ms", "x record"] if records else []) + ["function"]]  # fmt: skip
    for share in shares:
        call = share.seconds / share.calls
        row = [f"{share.seconds * 1e3:.4g}", f"{share.seconds / total:.1%}", str(share.calls),
               f"{call * 1e3:.4g}"]  # fmt: skip
        if records:
            record = records.get(share.function)
            row += [f"{record * 1e3:.4g}", f"{call / record:.2f}"] if record else ["-", "-"]
        rows.append([*row, share.function])
    lines = ["  " + line for line in aligned(rows, left={len(rows[0]) - 1})]
    end = (f"the calls add up to {total * 1e3:.4g} ms (TVM's debug executor, median of "
           f"{PROFILE_RUNS} runs)")  # fmt: skip
    if model is not None:
        end += f"; the model ran {model.seconds * 1e3:.4g} ms, the rest between the calls"
    lines.append(f"  {end}")
    recorded = [share for share in shares if records.get(share.function)]
    if recorded:
        ran = sum(share.seconds for share in recorded)
        timed = sum(records[share.function] * share.calls for share in recorded)
        calls = sum(share.calls for share in recorded)
        lines.append(f"  the {calls} calls built with records ran {ran * 1e3:.4g} ms, "
                     f"{ran / timed:.2f}x what their records add up to ({timed * 1e3:.4g} ms, "
                     "each timed alone with its data in cache)")  # fmt: skip
    return "\n".join(lines)


def summary(tuned: Run, untuned: Run) -> str:
    """Both latencies as medians with the middle half of their repeats, which is faster in
    words (no verdict where the two overlap), and how far apart their outputs are on the same
    inputs: a tuned build that is fast but computes something else shows here."""
    apart = max_difference(tuned.outputs, untuned.outputs)
    return (f"tuned {_timing(tuned)}, untuned {_timing(untuned)}: {_verdict(tuned, untuned)}; "
            f"outputs differ by at most {apart:.3g}")  # fmt: skip


def versus(tuned: Run, other: Run, name: str) -> str:
    """Another runtime's latency beside the tuned build's, with the same rules as
    :func:`summary`."""
    apart = max_difference(tuned.outputs, other.outputs)
    return (
        f"{name} {_timing(other)}: {_verdict(tuned, other)}; outputs differ by at most {apart:.3g}"
    )


def _timing(run: Run) -> str:
    low, high = run.spread
    middle = f"{low * 1e3:.4g}-{high * 1e3:.4g}"
    return f"{run.seconds * 1e3:.4g} ms (middle half {middle}, {len(run.repeats)} repeats)"


def slower(tuned: Run, untuned: Run) -> bool:
    """Whether every repeat of the middle half of ``tuned`` took longer than every one of
    ``untuned``'s: a difference the host's drift does not explain."""
    return untuned.spread[1] < tuned.spread[0]


def _verdict(tuned: Run, untuned: Run) -> str:
    if tuned.spread[1] < untuned.spread[0]:
        return f"tuned is {untuned.seconds / tuned.seconds:.2f}x faster"
    if slower(tuned, untuned):
        return f"tuned is {tuned.seconds / untuned.seconds:.2f}x slower"
    return "no difference beyond the spread of the repeats"


def max_difference(a: Sequence[np.ndarray[Any, Any]], b: Sequence[np.ndarray[Any, Any]]) -> float:
    return max((float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True)), default=0.0)
