"""What every tuner adapter provides, so that front ends treat the three tuners alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TunerTask:
    """One task of one tuner: its native object plus the fields every front end shows.

    ``native`` is what the tuner itself consumes (a MetaSchedule ``ExtractedTask``, an AutoTVM
    ``Task`` or an Ansor ``SearchTask``); ``key`` identifies the underlying primitive function.
    """

    name: str
    weight: int
    anchor_op: str
    key: str
    native: Any


@dataclass(frozen=True)
class Adapter:
    """A tuner reachable through the shared backend.

    ``extract(mod, target, params=None, **options)`` returns :class:`TunerTask` rows in the
    tuner's upstream order.
    """

    name: str
    extract: Callable[..., list[TunerTask]]
