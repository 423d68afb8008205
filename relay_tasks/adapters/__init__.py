"""One adapter per tuner over the shared backend, reachable by name through one registry."""

from __future__ import annotations

from . import ansor, autotvm, meta_schedule
from .base import Adapter, TunerTask

ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter for adapter in (meta_schedule.ADAPTER, autotvm.ADAPTER, ansor.ADAPTER)
}


def get_adapter(tuner: str | Adapter) -> Adapter:
    """Resolve a tuner name (or pass an :class:`Adapter` through)."""
    from ..errors import ModelError

    if isinstance(tuner, Adapter):
        return tuner
    try:
        return ADAPTERS[tuner]
    except (KeyError, TypeError):
        raise ModelError(
            f"unknown tuner {tuner!r}; choose one of {', '.join(ADAPTERS)} "
            "or pass a relay_tasks.adapters.Adapter"
        ) from None


__all__ = ["ADAPTERS", "Adapter", "TunerTask", "get_adapter"]
