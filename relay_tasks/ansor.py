"""``relay_tasks.ansor``: Ansor (auto_scheduler) tasks from the shared backend.

``extract_tasks(mod, params, target, ...)`` equals ``tvm.auto_scheduler.extract_tasks``.
"""

from .adapters.ansor import extract_tasks

__all__ = ["extract_tasks"]
