"""Each task's latency without records, so a build never takes a worse tuned one.

The first measurements of a search are random schedules, often slower than the schedule TOPI
gives the operator by default (on DCGAN, MetaSchedule's best of five random schedules of a
transposed convolution took 60-90 ms where the default takes 13): a model built with such
records is slower than untuned. So before tuning on this machine, the worker measures each
task's primitive function built alone as the tuner's build builds a task it has no record
of, once per work dir, and ``compile`` applies a task's records only where their best beats
that, as the tuner measured it and as timed here the same way (:func:`record_seconds`).
That default is the tuner's own build's, TOPI's schedule for every tuner: under MetaSchedule
and Ansor many x86 strategies (dense, batch_matmul, matmul, conv3d) pick an
implementation with TVM's naive schedule, left for the tuner (BERT-2's dense layers: 15 ms of
a model TOPI runs in 3.7), and the adapters' builds lower what no record covers as the build
without the tuner does (:mod:`relay_tasks.adapters.untuned`), with the weights as constants.

The latencies are kept in ``defaults.jsonl``, ``{"task": key, "seconds": s, "version": 5}`` a
line, read back through :func:`read_defaults`'s allowlist. Lines of an earlier version were
measured by an older relay-tasks (without a version: the naive schedules, or the weights as
inputs, which TOPI's dense repacks on every run; version 2: AutoTVM's dense weights still as
inputs; version 3: AutoTVM's convolution weights still as inputs; version 4: on one
core, as hhb-tvm's parallel launch ran every loop, see :mod:`relay_tasks._parallel`): the
next ``tune`` measures those tasks again, and until then they stand in, each named by
:func:`stale_defaults`. A record timed alike is kept there too,
``{"task": key, "best": b, "seconds": s, "version": 5}``, ``b`` the best latency its tuner
measured for the task: a compile times a record once, and a work dir builds the same model
the same way each time (where a record and the default are close, two timings disagree); one
of an earlier version is timed again.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..adapters import Adapter, TunerTask
from ..adapters.base import damaged, record_lines
from ..adapters.journal import append, locked, write_locked
from ..adapters.verify import seeded_values
from ..errors import TuningError

#: The file, in the work dir.
DEFAULTS_FILE = "defaults.jsonl"
#: What a task's key may look like in it (every tuner's keys are hex digests).
KEY = re.compile(r"[0-9a-f]{1,64}\Z")


#: How the defaults are measured now (see the module's docstring), and the earlier versions
#: whose lines stand in until measured again, as lines without a version do.
VERSION, EARLIER = 5, (2, 3, 4)


def read_defaults(work_dir: Path) -> dict[str, float]:
    """Each task's default latency (seconds) by its key (the ``alternatives_of`` of its
    tuner's tasks: alternatives of one function share one default), measured as now where
    the work dir has that, else as before (:func:`stale_defaults`)."""
    kept = _read(work_dir)
    return {**kept.stale, **kept.current}


def read_alike(work_dir: Path) -> dict[tuple[str, float], float]:
    """The best records ``compile`` timed as their defaults are, by task key and best."""
    return _read(work_dir).alike


def stale_defaults(work_dir: Path) -> set[str]:
    """The keys whose default latency was measured only by an older relay-tasks."""
    kept = _read(work_dir)
    return set(kept.stale) - set(kept.current)


@dataclass(frozen=True)
class _Kept:
    current: dict[str, float]  # defaults, measured as now
    stale: dict[str, float]  # defaults, measured before
    alike: dict[tuple[str, float], float]  # a task's best record, timed as its default


def _read(work_dir: Path) -> _Kept:
    """What ``defaults.jsonl`` holds; a line that is not exactly a key, a finite positive
    number of seconds and a version (this one or an earlier, :data:`EARLIER`), and for a
    record timed alike its finite positive best as measured, is a damaged record."""
    path = work_dir / DEFAULTS_FILE
    kept = _Kept({}, {}, {})
    for number, line in record_lines(path):
        entry = json.loads(line)
        fields = set(entry) if isinstance(entry, dict) else set()
        version = entry.get("version") if fields else None
        if not (fields in ({"task", "seconds"}, {"task", "seconds", "version"},
                           {"task", "best", "seconds", "version"})
                and ("version" not in fields or version in (VERSION, *EARLIER))
                and isinstance(entry["task"], str) and KEY.match(entry["task"])
                and positive(entry["seconds"]) and positive(entry.get("best", 1))):  # fmt: skip
            raise damaged(
                path, number, f"a default latency is a task key, seconds and version {VERSION}"
            )
        key, seconds = entry["task"], float(entry["seconds"])
        if "best" not in entry:
            (kept.current if version == VERSION else kept.stale)[key] = seconds
        elif version == VERSION:  # an earlier version's is timed again
            kept.alike[key, float(entry["best"])] = seconds
    return kept


def positive(value: Any) -> bool:
    """A finite positive number (not a bool, which JSON's reader gives for true)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value > 0)  # fmt: skip


def measure_defaults(
    adapter: Adapter, tasks: Sequence[TunerTask], target: Any, work_dir: Path
) -> None:
    """Measure, on this machine, the default latency of each task the work dir has none for,
    each built by ``adapter``'s build with no records."""
    done: set[str] = set()
    for task in tasks:
        key = task.alternatives_of
        if key in done or task.source is None or key in _read(work_dir).current:
            continue  # read each time: a tune beside this one measures them too
        done.add(key)
        seconds = _alone(adapter, task, target, work_dir, [])
        if seconds is None:
            continue
        line = json.dumps({"task": key, "seconds": seconds, "version": VERSION})
        with locked(work_dir):  # a tune beside this one may have measured it meanwhile
            if key not in _read(work_dir).current:
                write_locked(work_dir, [(DEFAULTS_FILE, [line])])


def record_seconds(
    adapter: Adapter, task: TunerTask, target: Any, work_dir: Path, best: float
) -> float | None:
    """The task's primitive function built alone with its records, timed as its default is
    (:func:`default_seconds`); None where it cannot be, or the build used no record of it.
    ``best`` is the best latency its tuner measured: the time is kept in the work dir for
    that best, and read back while it stands (a work dir one cannot write is timed anew).

    A tuner times its candidates on data of its own (MetaSchedule's and Ansor's runners fill
    the arguments at random, each its own way), the default here on seeded normal values; where
    the cost of a kernel depends on the values, the two do not compare. BERT-2's FFN dense, whose
    ``erf`` calls libm: Ansor measured a record at 0.83 ms, timed here it takes 1.93 ms
    against the default's 1.43 (in the model: 1.36 against 0.74)."""
    import warnings

    if task.source is None:
        return None
    kept = _read(work_dir).alike.get((task.key, best))
    if kept is not None:
        return kept
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the model's build says all there is to say
        seconds = _alone(adapter, task, target, work_dir, [task])
    if seconds is None or any("did not use the records" in str(w.message) for w in caught):
        return None
    line = {"task": task.key, "best": best, "seconds": seconds, "version": VERSION}
    with contextlib.suppress(TuningError, OSError):  # a work dir to read only: compile all the same
        append(work_dir, [(DEFAULTS_FILE, [json.dumps(line)])])
    return seconds


def _alone(
    adapter: Adapter, task: TunerTask, target: Any, work_dir: Path, records: list[TunerTask]
) -> float | None:
    """``task``'s function (it has a source) built alone by ``adapter`` with the records of
    ``records`` applied, its weights constants, and timed (:func:`default_seconds`)."""
    assert task.source is not None
    return default_seconds(
        task.source.func,
        target,
        lambda mod: adapter.build(mod, target, None, work_dir, records),
        weights=weight_params(task.source.func, task.source.lowered),
    )


#: The names of the computes in which TOPI's x86 computes pack a weight: ``dense_pack``'s,
#: and the convolutions' (``conv2d_NCHWc`` and its kin) when AutoTVM's templates are traced
#: without AlterOpLayout; AutoTVM's computes mark no layout-free placeholder. A weight left an
#: input is packed again on every run: ResNet-18's 512-channel 3x3 convolution then took 3.7
#: ms by default, 1.5 of them the packing, and 5.0 with a record AutoTVM measured at 2.0.
PACKED = frozenset({"packed_weight", "kernel_vec"})


def weight_params(func: Any, lowered: Any) -> frozenset[int]:
    """The parameters of a primitive function that its compute reads as weights (TOPI's
    ``layout_free_placeholders``, or what x86's ``dense_pack`` packs, which AutoTVM's dense
    computes carry instead): constants in the model, so that a build packs them ahead
    (AlterOpLayout's layout transforms folded); as inputs, TOPI's dense repacked its weight on
    every run, and BERT-2's FFN dense measured 1.46 ms by default against 0.2 packed (under
    AutoTVM 0.75 against 0.30, and records that beat 0.75 made the model 23% slower)."""
    from tvm import te

    if len(lowered.inputs) != len(func.params):  # a tuple parameter: no position to go by
        return frozenset()
    free: list[Any] = []
    seen: set[Any] = set()
    stack = [t.op for t in lowered.outputs]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if isinstance(op, te.ComputeOp):
            free += list(op.attrs.get("layout_free_placeholders", []) if op.attrs else [])
            free += op.input_tensors if op.name in PACKED else []
            stack += [t.op for t in op.input_tensors]
    return frozenset(
        index for index, tensor in enumerate(lowered.inputs)
        if any(tensor.op.same_as(w.op) for w in free)
    )  # fmt: skip


#: How a default (and a record timed alike) is timed: the median of 3 repeats of at least 33
#: ms. On ResNet-18's 30 tasks their spread over four timings (median 4.1%, at most 26%) is
#: that of 3 repeats of 100 ms (3.9%, 37%), for a third of the time (0.14 s a task against
#: 0.44: 9 s of a tune's start).
REPEATS, MIN_REPEAT_MS = 3, 33


def default_seconds(
    func: Any, target: Any, build: Callable[[Any], Any], weights: frozenset[int] = frozenset()
) -> float | None:
    """The primitive function ``func`` built alone by ``build`` (a module in, a graph
    executor factory out), the parameters at ``weights`` bound to seeded constants, and timed
    (the median of :data:`REPEATS` repeats of at least :data:`MIN_REPEAT_MS`); None where it
    cannot be built alone."""
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    rng = np.random.default_rng(0)
    bound: dict[Any, Any] = {}
    inputs = []
    for index, param in enumerate(func.params):
        if index in weights:
            bound[param] = relay.const(_values(rng, param.checked_type))
        else:  # named apart from the constants, which the build names p0, p1, ... as TVM does
            inputs.append(relay.var(f"input{index}", param.checked_type))
            bound[param] = inputs[-1]
    main = relay.Function(inputs, relay.bind(func.body, bound))  # not Primitive: as a model
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(main))
    try:
        library = build(mod)
    except Exception:  # a function TVM cannot build alone: no default to compare with
        return None
    device = tvm.cpu(0)
    graph = graph_executor.GraphModule(library["default"](device))
    for param in mod["main"].params:
        graph.set_input(param.name_hint, _values(rng, param.checked_type))
    timer = graph.module.time_evaluator(
        "run", device, number=1, repeat=REPEATS, min_repeat_ms=MIN_REPEAT_MS
    )
    return float(np.median(timer().results))


def _values(rng: np.random.Generator, ttype: Any) -> np.ndarray[Any, Any]:
    return seeded_values(rng, [int(d) for d in ttype.shape], str(ttype.dtype))
