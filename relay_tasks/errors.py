"""The package's exception types.

Every failure a user can cause (a bad model, a bad target, a missing dependency, an extraction
that cannot proceed) surfaces as one of these, with a message that says what was found, what was
expected and how to fix it. The CLI maps each class to its own exit code.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
import warnings
from pathlib import Path


class RelayTasksError(Exception):
    """Base class of every error relay-tasks raises on purpose."""

    exit_code = 1


class ModelError(RelayTasksError, ValueError):
    """The model (module, function, params or model file) cannot be used as given."""

    exit_code = 3


class TargetError(RelayTasksError, ValueError):
    """The target cannot be parsed, or is not one a tuner supports."""

    exit_code = 4


class DependencyError(RelayTasksError, ImportError):
    """An optional package needed for this input is not installed."""

    exit_code = 5


class ExtractionError(RelayTasksError, RuntimeError):
    """TVM failed while optimising or lowering a valid-looking model."""

    exit_code = 6


class TuningError(RelayTasksError, RuntimeError):
    """A tuner could not be set up or failed while tuning."""

    exit_code = 7


class UsageError(RelayTasksError, ValueError):
    """The command or call is wrong in itself: a flag combination, a count, a kind of path."""

    exit_code = 2


class TuningInterrupted(RelayTasksError):
    """SIGINT, SIGTERM or SIGHUP stopped a tune; what was measured is on disk and it resumes."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class RelayTasksWarning(UserWarning):
    """Base class of the warnings relay-tasks gives on purpose (the CLI prints them in one line)."""


class SkippedTaskWarning(RelayTasksWarning):
    """A primitive function was left out: its tuner cannot make a task of it (a dynamic shape)."""


class UnusedParamsWarning(RelayTasksWarning):
    """Some params name no parameter of ``main``: they were not bound (upstream ignores them)."""


class DamagedRecordWarning(RelayTasksWarning):
    """A log's last line was cut short (a crash while it was written) and was set aside."""


def warn(message: str, category: type[RelayTasksWarning]) -> None:
    """Warn at the first frame outside relay-tasks: the warning points at the user's line,
    whichever path inside the package led to it."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def describe_failure(err: BaseException) -> str:
    """One line for an error TVM raised: the last line of its message (TVM's C++ errors carry a
    whole backtrace before it), or where it was raised when it has no message (bare asserts in
    TOPI strategies)."""
    text = describe_text(str(err))
    if text:
        return text
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return type(err).__name__
    last = frames[-1]
    return f"{type(err).__name__} in {last.name} ({Path(last.filename).name}:{last.lineno})"


def describe_text(text: str) -> str:
    """The last line of an error text that is not a frame of a backtrace: TVM puts the message
    after its backtrace, dmlc's libraries (XGBoost) before theirs."""
    lines = [line.strip() for line in str(text).splitlines()]
    said = [line for line in lines if line and not _FRAME.match(line)]
    return said[-1] if said else ""


#: A line of dmlc's backtraces, which follow their message.
_FRAME = re.compile(r"Stack trace:$|\[bt\] \(\d+\) ")
