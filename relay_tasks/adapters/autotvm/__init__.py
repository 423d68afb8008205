"""AutoTVM: shared tasks -> ``tvm.autotvm.task.Task``, equal to ``extract_from_program``.

Upstream lowers the whole model with the VM compiler under AutoTVM's ``TaskExtractEnv``, which
records a template (name and arguments) every time an AutoTVM-registered TOPI compute runs. The
shared backend runs the very same computes when it lowers each distinct function to TE, so that
environment is on while the backend works; what each function records is kept apart and put
together again in the order the VM compiler would have lowered the functions (call order).

One module a role, as TVM's own tuners are laid out: :mod:`.tasks` (shared tasks to AutoTVM's),
:mod:`.database` (the work dir's records), :mod:`.session` (the search), :mod:`.runner` (where
candidates are built and measured) and :mod:`.library` (a library built from the records).
"""

from __future__ import annotations

from ..base import Adapter
from ..index import adopt_lines
from .database import ERRORS_FILE, FILES, LOG, check_configs, measurements, read
from .library import build
from .session import allotments, similar, tune
from .tasks import (
    NAME,
    create_task,
    decode,
    encode,
    extract,
    extract_tasks,
    extract_tasks_from_models,
    flops,
    key,
    merge,
)

ADAPTER = Adapter(
    NAME, extract, encode, decode, key, merge, tune, measurements, flops, build,
    (LOG, ERRORS_FILE),
    lambda tasks, work_dir: check_configs([t.native for t in tasks], work_dir),
    lambda tasks, source, work_dir: adopt_lines(read, FILES, tasks, source, work_dir),
    similar,
    FILES,
    read,
)  # fmt: skip

__all__ = [
    "ADAPTER",
    "FILES",
    "LOG",
    "NAME",
    "allotments",
    "build",
    "check_configs",
    "create_task",
    "decode",
    "encode",
    "extract",
    "extract_tasks",
    "extract_tasks_from_models",
    "flops",
    "key",
    "measurements",
    "merge",
    "read",
    "tune",
]
