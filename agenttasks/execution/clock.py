"""The schedules' clock: each worker process runs django-q2's scheduler every
`SCHEDULER_INTERVAL` seconds, so a schedule's tick fires within about that of its time (django-q2's
cluster alone runs it every 30 s). docs/lifecycle.md#schedules.
"""

import logging
import threading

from django.db import connection

from ..broker import queue
from ..compat import django_q
from ..conf import app_settings

logger = logging.getLogger(__name__)

_clock: threading.Thread | None = None
_clock_lock = threading.Lock()


def start_clock(**kwargs) -> None:
    """Start this process's clock thread once (connected to django-q2's worker start)."""
    global _clock
    with _clock_lock:
        if _clock is not None and _clock.is_alive():
            return
        _clock = threading.Thread(target=_tick, name="agenttasks-clock", daemon=True)
        _clock.start()


def _tick() -> None:
    while (interval := app_settings.SCHEDULER_INTERVAL) > 0:
        try:
            if queue.schedules_due():
                django_q.fire_due_schedules(queue.broker())
        except Exception:
            logger.exception("clock.pass_failed")
        finally:
            connection.close()  # hold no connection between passes
        threading.Event().wait(interval)
