"""``compile``'s last step: each task built from the record that ran fastest inside the model.

A tune times each candidate alone, over and over, its weights and inputs in cache. In the
model they come from memory (ResNet-18's convolutions ran 1.24x their records there,
MobileNetV2's calls 1.64x), and the candidate fastest alone is not always the fastest there.
So on this machine ``compile`` builds the model :data:`RANKS` - 1 more times: with every task's
second fastest record (that computes what it computes), then with its third; times each
function of each build with TVM's debug executor, the builds' runs taken in turn
(:func:`.compile.profiles`); and builds each task from the record that ran fastest there. That
build is kept only where, timed against the build with the fastest records in one interleaved
run, the model is faster as a whole. Tasks built with TVM's default stay so: a convolution
built TOPI's way picks its own channel blocks, and the layout conversions around it, which no
task's profile counts, changed (MobileNetV2 after 10 minutes, 2 tasks taking the default:
3.649 ms with the fastest records, 4.128 as chosen).

The choice is kept in the work dir's ``chosen.json`` under a digest of what it was chosen
from (this host's target, the work dir's, the model's tasks, and each task's fastest records
by their line in the records file), so the next ``compile`` of the model builds once. A new
record among a task's fastest, a prune, another host or another model makes it stale: it is
chosen again. The file is read through an allowlist: a digest, and ranks a choice can make.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..adapters.index import tally_in
from ..adapters.meta_schedule import NAME as META_SCHEDULE
from ..adapters.verify import CANDIDATES
from ..errors import RelayTasksError, TuningError
from ..files import read_regular
from ..inputs import host_target
from .compile import Built, Plan, Share, build, compare, profile, profiles
from .defaults import KEY, positive
from .tune import write_file

#: The file, in the work dir.
CHOSEN_FILE = "chosen.json"
#: Records tried per task, fastest first (the fastest is the build ``compile`` makes anyway).
RANKS = 3
#: Below this (the calls of the build with the fastest records, in seconds) nothing is
#: chosen: the debug executor's timer varies by more than such a model's records differ.
MIN_SECONDS = 1e-3
_DIGEST = re.compile(r"[0-9a-f]{64}\Z")


def applies(chosen: Plan) -> bool:
    """Whether a choice can be made for the plan: MetaSchedule's builds take a rank, and some
    of the model's tasks have records."""
    return chosen.adapter.name == META_SCHEDULE and bool(chosen.tuned)


def fastest_lines(chosen: Plan, work_dir: Path) -> dict[str, list[int]]:
    """Each measured task's fastest records (as many as a build looks at), by line number."""
    tally = tally_in(chosen.adapter, work_dir)
    return {t.key: [n for _, n, _ in tally.of(t.key).best[:CANDIDATES]] for t in chosen.tuned}


def digest(chosen: Plan, work_dir: Path) -> str:
    """What a choice depends on, as a hex digest."""
    return _digest(chosen, fastest_lines(chosen, work_dir))


def _digest(chosen: Plan, lines: Mapping[str, list[int]]) -> str:
    state = [str(host_target()), str(chosen.target), [t.key for t in chosen.tasks],
             sorted(t.key for t in chosen.slower), sorted(lines.items())]  # fmt: skip
    return hashlib.sha256(json.dumps(state).encode()).hexdigest()


def recall(chosen: Plan, work_dir: str | Path) -> Plan:
    """The plan with the choice an earlier ``compile`` made for it, where that still holds."""
    if not applies(chosen):
        return chosen
    ranks = _read(Path(work_dir), digest(chosen, Path(work_dir)))
    return chosen if ranks is None else _with(chosen, ranks)


def _with(chosen: Plan, ranks: Mapping[str, int]) -> Plan:
    """The plan that builds each task of ``ranks`` (built with records) from that rank."""
    applied = {t.key for t in chosen.applied}
    return replace(chosen, ranks={k: r for k, r in ranks.items() if k in applied}, in_model=True)


def _read(work_dir: Path, stamp: str) -> dict[str, int] | None:
    """The ranks ``chosen.json`` holds for ``stamp``; None for another digest, or a file
    that is not what :func:`_write` writes (it is then chosen again, and rewritten)."""
    data = read_regular(work_dir / CHOSEN_FILE)
    if data is None:
        return None
    try:
        entry = json.loads(data)
    except ValueError:
        return None
    if not (isinstance(entry, dict) and set(entry) == {"digest", "ranks", "ms"}):
        return None
    stamped, ranks, ms = entry["digest"], entry["ranks"], entry["ms"]
    if not (isinstance(stamped, str) and _DIGEST.match(stamped)
            and isinstance(ranks, dict) and all(_rank(k, r) for k, r in ranks.items())
            and isinstance(ms, list) and len(ms) == 2
            and all(positive(m) for m in ms)):  # fmt: skip
        return None
    return dict(ranks) if stamped == stamp else None


def _rank(key: Any, rank: Any) -> bool:
    """A task key, and a rank this module chooses (not 0: the fastest needs no entry)."""
    return (isinstance(key, str) and bool(KEY.match(key)) and not isinstance(rank, bool)
            and isinstance(rank, int) and 0 < rank < RANKS)  # fmt: skip


def _write(work_dir: Path, stamp: str, ranks: Mapping[str, int], ms: Sequence[float]) -> None:
    """Keep the choice; a work dir that cannot be written keeps none (the next compile
    chooses again)."""
    latencies = [float(f"{m:.4g}") for m in ms]
    text = json.dumps({"digest": stamp, "ranks": dict(ranks), "ms": latencies})
    with contextlib.suppress(TuningError):
        write_file(work_dir / CHOSEN_FILE, text + "\n")


def fastest(
    times: Sequence[Mapping[str, float]], chosen: Plan, records: Mapping[str, int]
) -> dict[str, int]:
    """Each task's rank whose calls took least inside the model (``times[r]``: seconds by task
    key in the build of every task's rank ``r``), where that is not its fastest record. A task
    built without records is left as it is, so is one a build has no time for, and no rank past
    a task's ``records`` (by task key: the build took its last record again) is chosen."""
    ways: dict[str, int] = {}
    for task in chosen.applied:
        timed = [(t[task.key], rank) for rank, t in enumerate(times)
                 if task.key in t and rank < records.get(task.key, 0)]  # fmt: skip
        if timed and timed[0][1] == 0:
            _, rank = min(timed, key=lambda pair: pair[0])  # the first of equals: its own
            if rank:
                ways[task.key] = rank
    return ways


def by_task(shares: Sequence[Share], functions: Mapping[str, str]) -> dict[str, float]:
    """A profile's seconds added up by the task each function is, where known."""
    seconds: dict[str, float] = {}
    for share in shares:
        key = functions.get(share.function)
        if key is not None:
            seconds[key] = seconds.get(key, 0.0) + share.seconds
    return seconds


def choose(
    mod: Any,
    params: Any,
    work_dir: str | Path,
    chosen: Plan,
    built: Built,
    inputs: dict[str, np.ndarray[Any, Any]],
) -> tuple[Plan, Built]:
    """The plan and build to keep: ``built`` (of ``chosen``), or the model built with each
    task's way that ran fastest inside it, where that runs faster (see the module)."""
    work = Path(work_dir)
    if chosen.in_model or not applies(chosen):
        return chosen, built
    lines = fastest_lines(chosen, work)
    stamp = _digest(chosen, lines)
    own = profile(built.factory, inputs)
    calls = sum(share.seconds for share in own) * 1e3
    if calls < MIN_SECONDS * 1e3:  # nothing kept: it is quick to see
        return chosen, built
    _say(f"timing each task's {RANKS} fastest records inside the model: {RANKS - 1} more "
         "builds (--no-choose skips this)")  # fmt: skip
    builds = []
    for rank in range(1, RANKS):
        _say(f"choosing: build {rank} of {RANKS - 1}, each task with its record number {rank + 1}")
        ranked = replace(chosen, ranks={t.key: rank for t in chosen.applied})
        try:
            builds.append(build(mod, params, work, ranked))
        except RelayTasksError as err:  # the build with the fastest records stands
            return _stopped(work, stamp, chosen, built, calls, f"that build failed ({err})")
    functions = dict(built.functions)
    for other in builds:
        functions.update(other.functions)
    factories = [built.factory, *(b.factory for b in builds)]
    times = [by_task(shares, functions) for shares in profiles(factories, inputs)]
    ways = fastest(times, chosen, {key: len(numbers) for key, numbers in lines.items()})
    if not ways:
        _write(work, stamp, {}, [calls, calls])
        _say("each task ran fastest inside the model with its fastest record")
        return _with(chosen, {}), built
    mixed = _with(chosen, ways)
    try:
        remade = build(mod, params, work, mixed)
    except RelayTasksError as err:
        return _stopped(work, stamp, chosen, built, calls, f"the build as chosen failed ({err})")
    ran, ran_mixed = compare([built.factory, remade.factory], inputs)
    ms = [ran.seconds * 1e3, ran_mixed.seconds * 1e3]
    said = f"{len(ways)} task(s) ran faster inside the model with another of their records"
    if ran_mixed.seconds < ran.seconds:
        _write(work, stamp, ways, ms)
        _say(f"{said}: built so, the model {ms[0]:.4g} -> {ms[1]:.4g} ms")
        return mixed, remade
    _write(work, stamp, {}, ms)
    _say(f"{said}, but the model built so was not faster ({ms[0]:.4g} -> {ms[1]:.4g} ms): "
         "built with the fastest records")  # fmt: skip
    return _with(chosen, {}), built


def _stopped(
    work: Path, stamp: str, chosen: Plan, built: Built, calls: float, why: str
) -> tuple[Plan, Built]:
    """The build with the fastest records (its ``calls`` added up to that many ms), kept as
    the choice: the next compile does not try again while the records stand."""
    _write(work, stamp, {}, [calls, calls])
    _say(f"choosing stopped, {why}: built with the fastest records")
    return _with(chosen, {}), built


def _say(line: str) -> None:
    print(f"relay-tasks: {line}", file=sys.stderr, flush=True)
