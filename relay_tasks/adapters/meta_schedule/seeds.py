"""Schedules shipped with relay-tasks, by CPU family: what a task with no records measures first.

TVM once shipped TopHub, AutoTVM configurations tuned per device, so that a first build was
already good. Here our own tunes of common models (``./dev seeds``, ``bench/seeds.py``) leave,
for each task, the schedules of its fastest records; a tune of any model whose tasks are those,
or operators like them at other shapes, starts each such task from them. A seed is a schedule,
never a measurement: it is measured on this machine like any candidate, and only that
measurement is kept. Its time on the machine it was tuned on is not shipped at all.

Tasks of one model differ by CPU family (x86 with AVX-512 lays convolutions out in blocks of
16 channels, with AVX2 of 8): a family's file serves only targets of that family. Each file is
read through the allowlist every record passes (:func:`.records.trace_problem`), a line at a
time, and replayed on the task derived here, never on a module from the file.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from tvm.target import Target

from ...errors import ModelError
from ..base import TunerTask
from ..records import trace_problem
from ..similar import STARTS_EACH, Sizes
from .tasks import flops as task_flops

#: Where the families' files are, one ``<family>.jsonl.gz`` each.
SHIPPED = Path(__file__).with_name("seeds")

#: The first line of a seed file, less its own fields ("family", "made").
FORMAT = "relay-tasks/seeds/1"

#: Largest seed file read, unpacked (the shipped ones hold well under a megabyte).
MAX_BYTES = 64 << 20

_KEY = re.compile(r"[0-9a-f]{16}")
_STEM = re.compile(r"[A-Za-z0-9_]{1,200}")
_FAMILY = re.compile(r"[a-z0-9-]{1,40}")
#: Most buffers a task's function takes, and most dimensions of one.
MOST_BUFFERS, MOST_DIMS = 64, 8


class Seed(NamedTuple):
    """A task tuned elsewhere: its key, its name's stem, its sizes (for nearness,
    :func:`.similar.nearest`) and the traces of its fastest records, postprocessing left out
    (each task's postprocessors finish them here)."""

    key: str
    stem: str
    sizes: Sizes
    traces: tuple[Any, ...]


def sizes(task: TunerTask) -> Sizes:
    """The shapes of the buffers a task's function takes, in order (a dynamic extent as 1),
    and its FLOPs: what nearness compares (:func:`.similar.nearest`)."""
    func = task.native.dispatched[0]["main"]
    shapes = [tuple(int(getattr(d, "value", 1)) for d in func.buffer_map[p].shape)
              for p in func.params]  # fmt: skip
    return shapes, task_flops(task.native)


def family(target: Target) -> str | None:
    """The CPU family whose seeds fit ``target``: ``x86-avx512``, ``x86-avx2``, ``aarch64``, or
    None (another device, or an x86 CPU with neither)."""
    from tvm.target.codegen import target_has_features

    if target.kind.name != "llvm":
        return None
    triple = str(target.attrs.get("mtriple", ""))
    if triple.startswith("aarch64"):
        return "aarch64"
    if not triple.startswith("x86_64"):
        return None
    with target:
        if target_has_features("avx512f"):
            return "x86-avx512"
        return "x86-avx2" if target_has_features("avx2") else None


def shipped_for(target: Target) -> tuple[Seed, ...]:
    """The seeds shipped for ``target``'s CPU family (none where no file is)."""
    name = family(target)
    return () if name is None else _shipped(name)


@functools.cache
def _shipped(name: str) -> tuple[Seed, ...]:
    path = SHIPPED / f"{name}.jsonl.gz"
    if not path.is_file():
        return ()
    try:
        return read_seeds(path, name)
    except (ModelError, OSError, EOFError) as err:  # a damaged install (gzip's own errors)
        said = str(err) if isinstance(err, ModelError) else f"{path}: {err}"
        raise ModelError(f"{said}; reinstall relay-tasks, or tune with --no-seeds") from err


def read_seeds(path: Path, name: str) -> tuple[Seed, ...]:
    """The seeds of ``path``, which must be ``name``'s family file; anything that is not as
    :func:`write_seeds` writes it is a ``ModelError`` naming the file and line."""
    with gzip.open(path, "rb") as packed:
        data = packed.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ModelError(f"{path}: unpacks to more than {MAX_BYTES:,} bytes; not a seed file")
    lines = data.decode("utf-8", errors="replace").splitlines()
    header = _json(path, 1, lines[0] if lines else "")
    made = header.get("made") if isinstance(header, dict) else None
    if not isinstance(made, str) or header != {"format": FORMAT, "family": name, "made": made}:
        raise ModelError(f"{path}:1: not a {FORMAT} file for {name}")
    seeds = []
    for number, line in enumerate(lines[1:], start=2):
        seed, problem = _seed(_json(path, number, line))
        if problem:
            raise ModelError(f"{path}:{number}: {problem}")
        seeds.append(seed)
    return tuple(seeds)


def _json(path: Path, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as err:
        raise ModelError(f"{path}:{number}: not JSON ({err})") from err


def _seed(row: Any) -> tuple[Any, str | None]:
    """A seed from one line of a seed file, or why the line is not one."""
    if not isinstance(row, dict) or set(row) != {"key", "stem", "shapes", "flops", "traces"}:
        return None, "a seed is {key, stem, shapes, flops, traces}"
    key, name, shapes, flops, traces = (row[f] for f in ("key", "stem", "shapes", "flops",
                                                          "traces"))  # fmt: skip
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        return None, "its key is not 16 hex digits"
    if not isinstance(name, str) or not _STEM.fullmatch(name):
        return None, "its stem is not a task name's"
    if not _shapes(shapes):
        return None, "its shapes are not lists of positive extents"
    if (
        isinstance(flops, bool)
        or not isinstance(flops, (int, float))
        or not (0 <= flops < math.inf)
    ):
        return None, "its FLOPs are not a finite count"
    if not isinstance(traces, list) or not 1 <= len(traces) <= STARTS_EACH:
        return None, f"it has not 1 to {STARTS_EACH} traces"
    problem = next(filter(None, map(trace_problem, traces)), None)
    if problem:
        return None, problem
    sizes = ([tuple(s) for s in shapes], float(flops))
    return Seed(key, name, sizes, tuple(traces)), None


def _shapes(shapes: Any) -> bool:
    return (
        isinstance(shapes, list)
        and len(shapes) <= MOST_BUFFERS
        and all(
            isinstance(shape, list)
            and len(shape) <= MOST_DIMS
            and all(type(d) is int and 0 < d < 2**31 for d in shape)
            for shape in shapes
        )
    )


def write_seeds(path: Path, name: str, made: str, seeds: Iterable[Seed]) -> None:
    """Write ``seeds`` as ``name``'s family file, saying how they were ``made``."""
    if not _FAMILY.fullmatch(name):
        raise ModelError(f"{name!r} is not a CPU family's name")
    lines = [json.dumps({"format": FORMAT, "family": name, "made": made})]
    for seed in seeds:
        shapes, flops = seed.sizes
        row = {"key": seed.key, "stem": seed.stem, "shapes": [list(s) for s in shapes],
               "flops": flops, "traces": list(seed.traces)}  # fmt: skip
        _, problem = _seed(row)
        if problem:
            raise ModelError(f"seed {seed.key}: {problem}")
        lines.append(json.dumps(row, separators=(",", ":")))
    with gzip.GzipFile(path, "wb", mtime=0) as packed:  # the same seeds, the same bytes
        packed.write(("\n".join(lines) + "\n").encode())


def count_seeded(seeds: Sequence[Seed], stems: Iterable[str]) -> int:
    """How many of the task stems ``stems`` have a seed of the same operators."""
    known = {s.stem for s in seeds}
    return sum(stem in known for stem in stems)
