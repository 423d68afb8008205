"""``relay_tasks.meta_schedule``: MetaSchedule tasks from the shared backend.

``extract_task_from_relay`` equals ``tvm.meta_schedule.relay_integration.extract_tasks``.
"""

from .adapters.meta_schedule import MODULE_EQUALITIES, extract_task_from_relay

__all__ = ["MODULE_EQUALITIES", "extract_task_from_relay"]
