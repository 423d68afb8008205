"""This machine's own target runs here; what the host module decides is checked through the
commands that refuse foreign code in tests/tuning/test_device.py."""

from __future__ import annotations

import relay_tasks
from relay_tasks.host import check_runs_here, fma_peak, missing_features, target_arch


def test_this_machines_target_runs_here() -> None:
    target = relay_tasks.host_target()
    check_runs_here(target, doing="measure")
    assert missing_features(target) == []
    assert target_arch(target) in ("x86_64", "aarch64")


def test_the_fma_peak_is_measured_for_this_cpu_only() -> None:
    """What the allocation's floors divide by: a finite rate here, nothing for a target
    measured elsewhere."""
    peak = fma_peak(relay_tasks.host_target())
    assert peak is not None and 1e9 < peak < 1e14
    assert fma_peak("cuda") is None
    assert fma_peak("llvm -mtriple=aarch64-linux-gnu") is None
