"""The loop after extraction: tune the tasks, see where tuning stands, compile with the records.

One module per verb (``tune``, ``status``, ``compile``); each reaches its tuner's specifics (how
it tunes, where its records are and what they say, how a build applies them) through the
adapter, so nothing here asks which tuner it is.
"""

from .records import Standing, TaskRecord, standing
from .tune import tune

__all__ = ["Standing", "TaskRecord", "standing", "tune"]
