"""The signal receiver that queues A2A push notifications (docs/a2a.md#push-notifications).

Connected at start-up, so it imports nothing of the a2a-sdk: the job it queues loads the
delivery (`push.py`) and the SDK with it.
"""

import logging

from django.db import connection

from .. import signals
from ..broker import queue
from ..delivery import outbox as deliveries
from ..models import A2APushConfig
from ..states import NOTIFIED

logger = logging.getLogger("agenttasks.a2a.push")

# Asked after the writes that did not read them (an ending on PostgreSQL does), and most tasks
# have no config: plain SQL, without the ORM's compiling.
CONFIGS_OF_TASK = f"SELECT id FROM {A2APushConfig._meta.db_table} WHERE task_id = %s"


def on_task_updated(sender, task=None, **kwargs) -> None:
    """Queue one delivery per config of a task that entered a notified state."""
    if task is None or task.status not in NOTIFIED:
        return
    config_ids = task.push_configs_at_end  # an ending on PostgreSQL read them under its lock
    if config_ids is None:
        try:
            with connection.cursor() as cursor:
                cursor.execute(CONFIGS_OF_TASK, [task.id])
                config_ids = [pk for (pk,) in cursor.fetchall()]
        except Exception:
            logger.exception("a2a.push_lookup_failed task=%s", task.id)
            return
    for pk in config_ids:
        queue.enqueue_job(deliveries.PUSH_JOB, pk, task.status, task.version)


def connect() -> None:
    """Follow every task update (apps.ready, with the `a2a` extra)."""
    signals.task_updated.connect(on_task_updated, dispatch_uid="agenttasks.a2a.push")
