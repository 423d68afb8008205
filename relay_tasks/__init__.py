"""relay-tasks: tuning tasks for MetaSchedule, AutoTVM and Ansor from a Relay model, fast.

One shared backend optimises and fuses the model the way upstream TVM does, deduplicates the
primitive functions and lowers each to TE compute only (no schedule, no build); per-tuner adapters
turn those tasks into each tuner's own task objects.
"""

import os as _os

# AutoTVM would try to download TopHub configs during extraction; this machine has no internet.
_os.environ.setdefault("TOPHUB_LOCATION", "NONE")

# All three act when imported, in this order: _parallel before anything loads libtvm (whose
# parallel launch is then ours, on every core), _memoize before anything imports tvm.topi,
# then _deferred imports tvm.relay (which imports tvm.topi) with its frontends deferred.
# isort: off
from . import _parallel  # noqa: F401
from . import _memoize  # noqa: F401
from . import _deferred  # noqa: F401

# isort: on
from . import (
    ansor,
    autotvm,
    meta_schedule,
)
from .api import extract, extract_models
from .dropin import install, installed, uninstall
from .errors import (
    DamagedRecordWarning,
    DependencyError,
    ExtractionError,
    ModelError,
    RelayTasksError,
    RelayTasksWarning,
    SkippedTaskWarning,
    TargetError,
    TuningError,
    TuningInterrupted,
    UnusedParamsWarning,
    UsageError,
)
from .export import load_tasks
from .inputs import host_target
from .loaders import load_model
from .loaders.winograd import winograd_convolutions
from .lowering.extract import Task, extract_tasks
from .tuning import tune

__all__ = [
    "DamagedRecordWarning",
    "DependencyError",
    "ExtractionError",
    "ModelError",
    "RelayTasksError",
    "RelayTasksWarning",
    "SkippedTaskWarning",
    "TargetError",
    "Task",
    "TuningError",
    "TuningInterrupted",
    "UnusedParamsWarning",
    "UsageError",
    "ansor",
    "autotvm",
    "extract",
    "extract_models",
    "extract_tasks",
    "host_target",
    "install",
    "installed",
    "load_model",
    "load_tasks",
    "meta_schedule",
    "tune",
    "uninstall",
    "winograd_convolutions",
]
