"""A task's priority: what the claims take first within each owner's share
(docs/lifecycle.md#when-a-task-starts)."""

from .. import store
from ..exceptions import TaskNotFound

LOWEST, HIGHEST = -100, 100


def set_priority(task_id: str, priority: int) -> None:
    """Set a task's priority (an operator's, from the admin; site code's too).

    Raises ValueError for a priority outside -100..100 and TaskNotFound for an unknown task. A
    queued run is claimed in its new place; a running one is not affected.
    """
    checked(priority)
    if not store.set_priority(task_id, priority):
        raise TaskNotFound(task_id)


def checked(priority: int) -> int:
    """Return the priority, or raise ValueError when it is not an integer from -100 to 100."""
    valid = isinstance(priority, int) and not isinstance(priority, bool)
    if not valid or not LOWEST <= priority <= HIGHEST:
        raise ValueError("priority must be an integer from -100 to 100")
    return priority
