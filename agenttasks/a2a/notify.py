"""The signal receiver that queues A2A push notifications (docs/a2a.md#push-notifications).

Connected at start-up, so it imports nothing of the a2a-sdk: the job it queues loads the
delivery (`push.py`) and the SDK with it.
"""

import logging

from .. import signals
from ..broker import queue
from ..delivery import outbox as deliveries
from ..models import A2APushConfig
from ..states import NOTIFIED

logger = logging.getLogger("agenttasks.a2a.push")


def on_task_updated(sender, task=None, **kwargs) -> None:
    """Queue one delivery per config of a task that entered a notified state."""
    if task is None or task.status not in NOTIFIED:
        return
    try:
        config_ids = list(
            A2APushConfig.objects.filter(task_id=task.id).values_list("pk", flat=True)
        )
    except Exception:
        logger.exception("a2a.push_lookup_failed task=%s", task.id)
        return
    for pk in config_ids:
        queue.enqueue_job(deliveries.PUSH_JOB, pk, task.status, task.version)


def connect() -> None:
    """Follow every task update (apps.ready, with the `a2a` extra)."""
    signals.task_updated.connect(on_task_updated, dispatch_uid="agenttasks.a2a.push")
