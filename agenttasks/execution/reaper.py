"""The reaper: fail runs whose worker died, re-enqueue forgotten runs and deliveries, time out
actions.

It runs at cluster start and every REAP_INTERVAL in each worker process (a daemon thread), as a
django-q2 schedule that installs itself, and as `manage.py agenttasks_reap`. Every rule is
lease-based and every write a compare-and-set, so any number of reapers on any number of
machines can run at once.
"""

import logging
import random
import threading

from django.db import close_old_connections
from django.utils import timezone

from .. import lifecycle, store
from ..broker import queue
from ..conf import app_settings
from ..delivery import outbox as deliveries
from ..flow import budgets
from ..operations import health, metrics, retention

logger = logging.getLogger(__name__)

SCHEDULE_NAME = "agenttasks reaper"
_ticker: threading.Thread | None = None
_ticker_lock = threading.Lock()


def reap() -> dict:
    """Run one reaper pass; return what it did (the django-q2 schedule's job)."""
    close_old_connections()
    try:
        failed = lifecycle.recover()
        budgets.forget_lapsed()
        health.record_pass()
        metrics.count("agenttasks_orphans_failed_total", len(failed))
        return {"failed": [t.id for t in failed]}
    finally:
        close_old_connections()


def preview() -> dict:
    """Say what a reaper pass would do, changing nothing (`agenttasks_reap --dry-run`)."""
    now = timezone.now()
    held = queue.queued_runs(app_settings.REQUEUE_AFTER)
    return {
        "orphans": list(store.orphans(store.lease_cutoff()).values_list("id", flat=True)),
        "requeue": [
            run_id
            for run_id in store.stale_queued(now).values_list("id", flat=True)[:1000]
            if held is None or run_id not in held
        ],
        "expired_actions": list(store.lapsed_actions(now).values_list("id", flat=True)),
        "overdue_deliveries": list(deliveries.overdue(now).values_list("pk", flat=True)[:1000]),
        "interrupted_deletes": store.interrupted_deletes(),
        "owed_conversations": store.conversations_owed(),
    }


def _tick() -> None:
    interval = app_settings.REAP_INTERVAL
    while True:
        try:
            reap()
        except Exception:
            logger.exception("reaper.pass_failed")
        # Jitter spreads the passes of several worker processes over the interval.
        threading.Event().wait(interval * random.uniform(0.75, 1.25))


def start_ticker(**kwargs) -> None:
    """Start this process's reaper thread once (connected to django-q2's worker start)."""
    global _ticker
    with _ticker_lock:
        if _ticker is not None and _ticker.is_alive():
            return
        queue.install_schedule(SCHEDULE_NAME, "agenttasks.execution.reaper.reap")
        queue.install_schedule(
            retention.SCHEDULE_NAME, "agenttasks.operations.retention.run", daily=True
        )
        _ticker = threading.Thread(target=_tick, name="agenttasks-reaper", daemon=True)
        _ticker.start()
