"""MetaSchedule: shared tasks -> ``tvm.meta_schedule.ExtractedTask``, equal to upstream's.

Upstream (``relay.backend.MetaScheduleExtractTask``) turns every primitive function occurrence
into a TIR module and deduplicates on *that* with the chosen module equality, so this adapter does
the same over the backend's occurrences: TIR once per distinct function, then upstream's order
(post order reversed; sorted by op count first for ``anchor-block``) and naming.

One module a role, as TVM's own ``meta_schedule`` package is laid out: :mod:`.tasks` (shared
tasks to MetaSchedule's), :mod:`.database` (the work dir's database), :mod:`.session` (task
scheduler and search), :mod:`.runner` (where candidates are built and measured) and
:mod:`.library` (a library built from the records).
"""

from __future__ import annotations

from ..base import Adapter
from .database import FILES, LOGS, adopt, measurements, read
from .library import build
from .session import seeded, similar, tune
from .tasks import (
    DEFAULT_PASS_CONFIG,
    MODULE_EQUALITIES,
    NAME,
    decode,
    encode,
    extract,
    extract_task_from_relay,
    flops,
    key,
    merge,
    register_intrinsics,
    tir_module,
)

ADAPTER = Adapter(
    NAME,
    extract,
    encode,
    decode,
    key,
    merge,
    tune,
    measurements,
    flops,
    build,
    LOGS,
    adopt=adopt,
    similar=similar,
    seeded=seeded,
    files=FILES,
    read=read,
)

__all__ = [
    "ADAPTER",
    "DEFAULT_PASS_CONFIG",
    "FILES",
    "LOGS",
    "MODULE_EQUALITIES",
    "NAME",
    "build",
    "decode",
    "encode",
    "extract",
    "extract_task_from_relay",
    "flops",
    "key",
    "measurements",
    "merge",
    "read",
    "register_intrinsics",
    "tir_module",
    "tune",
]
