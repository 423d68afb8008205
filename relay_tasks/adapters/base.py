"""What every tuner adapter provides, so that front ends treat the three tuners alike."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TunerTask:
    """One task of one tuner: its native object plus the fields every front end shows.

    ``native`` is what the tuner itself consumes (a MetaSchedule ``ExtractedTask``, an AutoTVM
    ``Task`` or an Ansor ``SearchTask``); ``key`` identifies it across models and processes (two
    tasks with the same key and target are the same tuning problem); ``models`` names the models
    that use it.
    """

    name: str
    weight: int
    anchor_op: str
    key: str
    native: Any
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class Runner:
    """Where measurements run: on this machine, or on devices behind a TVM RPC tracker."""

    tracker: tuple[str, int] | None = None
    key: str | None = None
    timeout: float = 20.0


@dataclass(frozen=True)
class Adapter:
    """A tuner reachable through the shared backend.

    - ``extract(mod, target, params=None, **options)``: :class:`TunerTask` rows, upstream order;
    - ``encode(native)`` / ``decode(payload, target)``: a task to and from JSON-able data;
    - ``merge(tasks)``: one task from equal tasks of several models (weights added);
    - ``tune(tasks, target, trials, work_dir, runner)``: tune, logging to ``work_dir`` and
      resuming from what is already logged there; returns the number of measurements logged.
    """

    name: str
    extract: Callable[..., list[TunerTask]]
    encode: Callable[[Any], dict[str, Any]] = field(repr=False)
    decode: Callable[[dict[str, Any], Any], Any] = field(repr=False)
    merge: Callable[[Sequence[TunerTask]], Any] = field(repr=False)
    tune: Callable[[Sequence[TunerTask], Any, int, Path, Runner], int] = field(repr=False)
