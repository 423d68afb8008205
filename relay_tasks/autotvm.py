"""``relay_tasks.autotvm``: AutoTVM tasks from the shared backend.

``extract_tasks`` equals ``tvm.autotvm.task.extract_from_program``.
"""

from .adapters.autotvm import extract_tasks

__all__ = ["extract_tasks"]
