"""This machine's own target runs here; what the host module decides is checked through the
commands that refuse foreign code in tests/tuning/test_device.py."""

from __future__ import annotations

import relay_tasks
from relay_tasks.host import check_runs_here, missing_features, target_arch


def test_this_machines_target_runs_here() -> None:
    target = relay_tasks.host_target()
    check_runs_here(target, doing="measure")
    assert missing_features(target) == []
    assert target_arch(target) in ("x86_64", "aarch64")
