"""``relay_tasks.ansor``: Ansor (auto_scheduler) tasks from the shared backend.

``extract_tasks(mod, target, params, ...)`` equals ``tvm.auto_scheduler.extract_tasks`` (in the
order of every relay-tasks extractor; upstream's order is the drop-in's).
"""

from .adapters.ansor import extract_tasks

__all__ = ["extract_tasks"]
