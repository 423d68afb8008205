"""A record is applied only where its schedule computes what its task computes.

A tuner measures a schedule's time, never its results: on this TVM build MetaSchedule measured
a schedule of ``dense + bias_add`` (4x256 by 128x256; the bias inlined, the reduction split by
1 and unrolled 512 deep, vectorized) as valid and fastest while its code computed another
function (off by up to 55), and the model built with it gave wrong answers. So before a build
applies a task's best record, the scheduled function and the task's unscheduled one run here
on the same seeded arguments; a record whose results differ is passed over for the task's next
best that agrees (up to :data:`CANDIDATES` of them), with a warning.

MetaSchedule's records are checked as TIR, Ansor's states applied to the task's compute DAG,
AutoTVM's configs instantiated from its template against the fallback config (on this build an
Ansor state of ``dense + 1``, 8x32 by 16x32, measured valid at 0.13 ms, computed NaN in the
model). Both run on this CPU: where the target's code cannot run here (another architecture, a
GPU), the records are applied unchecked.

A MetaSchedule tune checks too, as it measures: a candidate faster than its task's best so
far is built here from its schedule and run on the same arguments; one that disagrees is filed
as a failure, so the search goes on from schedules that compute right instead of spending its
rounds around one the build would pass over.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tvm

from ..errors import RelayTasksWarning, TargetError

#: The best records of a task tried, best first, before it is built without one.
CANDIDATES = 5


def runs_here(target: Any) -> bool:
    from ..host import check_runs_here

    try:
        check_runs_here(target, doing="verify")
    except TargetError:
        return False
    return bool(target.kind.name == "llvm")


def same_results(reference: tvm.IRModule, scheduled: tvm.IRModule, target: Any) -> bool:
    """Whether two TIR modules of one ``main`` (a task's compute, unscheduled and scheduled)
    leave the same values in every buffer, from the same seeded arguments (see
    :func:`agrees_with`)."""
    return agrees_with(results(reference, target), scheduled, target)


def results(mod: tvm.IRModule, target: Any) -> list[np.ndarray[Any, Any]] | None:
    """What ``mod``'s ``main`` leaves in its buffers from the seeded arguments; None where it
    does not build (a task's compute alone: nothing to check against)."""
    try:
        return _run(mod, target)
    except tvm.TVMError:
        return None


def agrees_with(
    expected: list[np.ndarray[Any, Any]] | None, scheduled: tvm.IRModule, target: Any
) -> bool:
    """Whether ``scheduled`` leaves the ``expected`` :func:`results`, up to the rounding a
    reordered reduction makes (a relative 1e-3 of the largest value). A schedule that fails to
    build disagrees; with nothing expected (a compute that does not build alone) every
    schedule passes."""
    if expected is None:
        return True
    try:
        scheduled_out = _run(scheduled, target)
    except tvm.TVMError:
        return False
    for want, got in zip(expected, scheduled_out, strict=True):
        if want.dtype.kind not in "fc":
            if not np.array_equal(want, got):
                return False
            continue
        scale = float(np.nanmax(np.abs(want))) if want.size and np.isfinite(want).any() else 1.0
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3 * max(scale, 1.0), equal_nan=True):
            return False
    return True


def _run(mod: tvm.IRModule, target: Any) -> list[np.ndarray[Any, Any]]:
    func = mod["main"]
    arrays = []
    for seed, param in enumerate(func.params):
        buffer = func.buffer_map[param]
        shape = [int(d) for d in buffer.shape]
        arrays.append(seeded_values(np.random.default_rng(seed), shape, str(buffer.dtype)))
    library = tvm.build(mod, target=target)
    device = tvm.cpu(0)
    nds = [tvm.nd.array(array, device) for array in arrays]
    library(*nds)
    return [nd.numpy() for nd in nds]


def seeded_values(
    rng: np.random.Generator, shape: Sequence[int], dtype: str
) -> np.ndarray[Any, Any]:
    """Values to run a function on: normal floats; 0 and 1 for integers (an index into any
    table)."""
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 2, size=list(shape)).astype(dtype)
    return rng.standard_normal(list(shape)).astype(dtype)


def first_agreeing(candidates: list[Any], agrees: Callable[[Any], bool]) -> tuple[Any, int]:
    """The first of ``candidates`` (best first) that ``agrees``, or None, and how many were
    passed over."""
    for passed, candidate in enumerate(candidates):
        if agrees(candidate):
            return candidate, passed
    return None, len(candidates)


def warn_wrong_records(task: str, passed: int, replaced: bool) -> None:
    instead = "its next best record, which does" if replaced else "TVM's default schedule"
    warnings.warn(
        f"{task}: the best {passed} of its records compute something else than the task "
        f"(TVM's code for those schedules is wrong); built with {instead}",
        RelayTasksWarning,
        stacklevel=4,
    )


def best_agreeing(
    name: str,
    candidates: Sequence[tuple[float, Any]],
    expected: list[np.ndarray[Any, Any]] | Callable[[Any], Any] | None,
    schedule: Callable[[Any], tvm.IRModule],
    target: Any,
) -> Any:
    """Of task ``name``'s ``candidates`` ((seconds, record) pairs), the fastest whose
    ``schedule`` (the record applied, as a TIR module) leaves the ``expected`` results, among
    the best :data:`CANDIDATES`; None if none does. Passing some over is warned about.
    ``expected`` may also be a function of the record giving those results: where a record's
    config chooses the layouts of the buffers (AutoTVM's ``conv2d_NCHWc``), each has its own."""
    best = [record for _, record in sorted(candidates, key=lambda c: c[0])[:CANDIDATES]]

    def agrees(record: Any) -> bool:
        try:
            scheduled = schedule(record)
            wanted = expected(record) if callable(expected) else expected
        except tvm.TVMError:  # a record this compute cannot take
            return False
        return agrees_with(wanted, scheduled, target)

    chosen, passed = first_agreeing(best, agrees)
    if passed:
        warn_wrong_records(name, passed, chosen is not None)
    return chosen
