"""The deliveries an ending owes: its callback and its A2A push notifications (an outbox).

The ending records them in its own transaction (`Delivery` rows: `store.rows.owe_deliveries`, or
on PostgreSQL a trigger), and queues their jobs after commit. A job deletes its row as it claims
the delivery (`settle_callback`, `settle_push`); the reaper sends again, with a backoff, what is still owed REQUEUE_AFTER
after it was due (`resend_overdue`), so a broker or a database that fails between the commit and
the enqueue loses nothing. The claim stays each job's compare-and-set on the task's version, so
a delivery sent again by the reaper is still sent once.
"""

import logging
from datetime import datetime, timedelta

from django.utils import timezone

from ..broker import queue
from ..conf import app_settings
from ..models import Delivery

logger = logging.getLogger(__name__)

CALLBACK_JOB = "agenttasks.delivery.callbacks.send"
PUSH_JOB = "agenttasks.a2a.push.deliver"
BATCH = 1000  # deliveries sent again per reaper pass
MAX_BACKOFF = 64  # times REQUEUE_AFTER


def settle_callback(task_id: str, version: int) -> None:
    """Drop the task's callbacks owed up to `version`: a job claimed them."""
    Delivery.objects.filter(task_id=task_id, config=None, version__lte=version).delete()


def settle_push(config_id: int, version: int) -> None:
    """Drop one push config's deliveries owed up to `version`: a job claimed them."""
    Delivery.objects.filter(config_id=config_id, version__lte=version).delete()


def job_of(delivery: Delivery) -> tuple:
    """Return the job that makes a delivery: its function and arguments."""
    if delivery.config_id is None:
        return CALLBACK_JOB, delivery.task_id, delivery.status, delivery.version
    return PUSH_JOB, delivery.config_id, delivery.status, delivery.version


def overdue(now: datetime | None = None):
    """Return deliveries no job has claimed REQUEUE_AFTER after they were due, oldest first."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=app_settings.REQUEUE_AFTER)
    return Delivery.objects.overdue(cutoff).order_by("due_at", "pk")


def resend_overdue() -> int:
    """Queue again the job of each overdue delivery (a reaper pass); return how many.

    Each is due again after twice as long as the last time (at most 64 × REQUEUE_AFTER), so a
    job that waits behind a long queue is not queued again on every pass.
    """
    now = timezone.now()
    sent = 0
    for delivery in overdue(now)[:BATCH]:
        try:
            queue.enqueue_now(*job_of(delivery))
        except Exception:
            logger.exception("deliveries.resend_failed delivery=%s", delivery.pk)
            continue
        backoff = min(2**delivery.attempts, MAX_BACKOFF) - 1
        Delivery.objects.filter(pk=delivery.pk).update(
            attempts=delivery.attempts + 1,
            due_at=now + timedelta(seconds=backoff * app_settings.REQUEUE_AFTER),
        )
        sent += 1
    if sent:
        logger.info("deliveries.resent count=%d", sent)
    return sent
