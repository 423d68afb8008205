"""Ansor (auto_scheduler): shared tasks -> ``SearchTask`` and weights, equal to upstream's.

Upstream compiles the model with the VM compiler under a ``TracingEnvironment``: every function
the compiler lowers is handed, by name, to ``auto_schedule_topi``, which records its workload
key; at the end the compiler reports how often each function was used (``op_weights``) and the
environment's weights are rebuilt from that report. The tasks come out in the order of that
report, which is the iteration order of the compiler's hash-map cache (keyed by a hash of the
labelled function and the target) copied through two TVM maps. This adapter hands the same
functions, under the same names, to the same ``auto_schedule_topi``, and replays the report in the
same order, so workload keys, descriptions, weights and order all come out equal.

One module a role, as TVM's own tuners are laid out: :mod:`.tasks` (shared tasks to Ansor's),
:mod:`.database` (the work dir's records), :mod:`.session` (task scheduler and search),
:mod:`.runner` (where candidates are measured) and :mod:`.library` (a library built from the
records).
"""

from __future__ import annotations

from ..base import Adapter
from ..index import adopt_lines
from .database import ERRORS_FILE, FILES, LOG, measurements, read
from .library import build
from .session import similar, tune
from .tasks import (
    NAME,
    decode,
    default_hardware_params,
    encode,
    extract,
    extract_tasks,
    flops,
    key,
    merge,
)

ADAPTER = Adapter(
    NAME, extract, encode, decode, key, merge, tune, measurements, flops, build,
    (LOG, ERRORS_FILE),
    adopt=lambda tasks, source, work_dir: adopt_lines(read, FILES, tasks, source, work_dir),
    similar=similar,
    files=FILES,
    read=read,
)  # fmt: skip

__all__ = [
    "ADAPTER",
    "FILES",
    "LOG",
    "NAME",
    "build",
    "decode",
    "default_hardware_params",
    "encode",
    "extract",
    "extract_tasks",
    "flops",
    "key",
    "measurements",
    "merge",
    "read",
    "tune",
]
