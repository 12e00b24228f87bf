"""The deliveries an ending owes: its callback and its A2A push notifications (an outbox).

The ending records them in its own transaction (`Delivery` rows: `store.rows.owe_deliveries`, or
on PostgreSQL a trigger), and queues their jobs after commit. A job leases its row as it starts
(`lease_callback`, `lease_push`: one UPDATE, which only one job wins, so a job delivered twice
POSTs once) and deletes it only after the receiver answered or the failure is recorded
(`settle_callback`, `settle_push`). The reaper sends again, with a backoff, what is still owed
REQUEUE_AFTER after it was due and is not leased (a worker that stopped or died mid-POST leaves
its lease to lapse), unless its job still waits in the broker (`resend_overdue`). So delivery is
at least once: every POST carries the `X-Agenttasks-Delivery` id of its ending and target, the
same on every re-send, for receivers to de-duplicate (docs/rest.md#callbacks).
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
LEASE_MARGIN = 5  # seconds a lease outlasts its exchanges: name resolution, the records
DELIVERY_HEADER = "X-Agenttasks-Delivery"


def delivery_id(task_id: str, version: int, config_pk: int | None = None) -> str:
    """Name one ending's delivery to one target (the callback, or a push config), the same on
    every re-send: receivers de-duplicate by it."""
    return f"{task_id}.{version}" if config_pk is None else f"{task_id}.{version}.{config_pk}"


def lease_callback(task_id: str, version: int, seconds: float) -> bool:
    """Hold the task's callback owed for `version` for `seconds`; False when it is not owed
    (sent already) or another job holds it."""
    return _lease(Delivery.objects.filter(task_id=task_id, config=None, version=version), seconds)


def lease_push(config_id: int, version: int, seconds: float) -> bool:
    """Hold one push config's delivery owed for `version` for `seconds`, as `lease_callback`."""
    return _lease(Delivery.objects.filter(config_id=config_id, version=version), seconds)


def _lease(owed, seconds: float) -> bool:
    now = timezone.now()
    return bool(owed.claimable(now).update(leased_until=now + timedelta(seconds=seconds)))


def settle_callback(task_id: str, version: int) -> None:
    """Drop the task's callbacks owed up to `version`: this one was sent (or is moot), and an
    older ending's after it would be stale."""
    Delivery.objects.filter(task_id=task_id, config=None, version__lte=version).delete()


def settle_push(config_id: int, version: int) -> None:
    """Drop one push config's deliveries owed up to `version`, as `settle_callback`."""
    Delivery.objects.filter(config_id=config_id, version__lte=version).delete()


def job_of(delivery: Delivery) -> tuple:
    """Return the job that makes a delivery: its function and arguments."""
    if delivery.config_id is None:
        return CALLBACK_JOB, delivery.task_id, delivery.status, delivery.version
    return PUSH_JOB, delivery.config_id, delivery.status, delivery.version


def overdue(now: datetime | None = None):
    """Return deliveries not sent REQUEUE_AFTER after they were due (or after the lease of the
    job that took them lapsed), oldest first."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=app_settings.REQUEUE_AFTER)
    return Delivery.objects.overdue(cutoff).order_by("due_at", "pk")


def resend_overdue() -> int:
    """Queue again the job of each overdue delivery (a reaper pass); return how many.

    A delivery whose job still waits in the broker (django-q2's ORM broker on this database) is
    left to it, as a queued run is. With another broker each is due again after twice as long
    as the last time (at most 64 × REQUEUE_AFTER), so a job that waits behind a long queue is
    not queued again on every pass.
    """
    now = timezone.now()
    queued = queue.queued_jobs({CALLBACK_JOB, PUSH_JOB}, app_settings.REQUEUE_AFTER)
    sent = 0
    for delivery in overdue(now)[:BATCH]:
        func, *args = job_of(delivery)
        if queued is not None and (func, queue.job_args(args)) in queued:
            continue
        try:
            queue.enqueue_now(func, *args)
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
