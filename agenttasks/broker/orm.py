"""django-q2's ORM broker, whose pusher waits for new jobs instead of polling (PostgreSQL).

django-q2's own ORM broker reads its queue table every `poll` seconds (0.05 in the demo), idle or
not: a few percent of a core and of PostgreSQL for every cluster that does nothing. Here every
statement that enqueues jobs notifies JOBS_CHANNEL at its commit (a trigger on the queue table,
agenttasks/sql/jobs_notify_v1.sql, whatever writes the job), and an idle pusher waits on its own
LISTENing connection for up to IDLE_WAIT before it reads the queue again: a job is taken at once,
and an idle cluster reads its queue once a IDLE_WAIT. A job whose lock lapsed (django-q2's
`retry`) notifies nothing; the next read finds it. On another database it polls as django-q2's.

    Q_CLUSTER = {"orm": "default", "broker_class": "agenttasks.broker.orm.ListeningORM", ...}
"""

import logging
import time

from django.db import connections
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf

from .listen import raw_connection
from .queue import JOBS_CHANNEL

logger = logging.getLogger(__name__)

IDLE_WAIT = 1.0  # seconds an idle pusher waits for a notification before it reads again
SESSION_NAME = "agenttasks pusher"


class ListeningORM(ORM):
    """The ORM broker; on PostgreSQL its dequeue waits for a notification when the queue is idle."""

    def __init__(self, list_key: str | None = None):
        super().__init__(list_key)
        self._listener = None
        self._broken_at = -IDLE_WAIT  # when the listening connection last failed (monotonic)

    def dequeue(self):
        taken = self._take()
        if taken:
            return taken
        if not self._wait_for_jobs():
            time.sleep(Conf.POLL)  # not PostgreSQL, or the listener is down: poll
        return None

    def _take(self) -> list[tuple[int, str]]:
        """Lock up to Conf.BULK due jobs for this cluster (a compare-and-set on each lock)."""
        queue = self.get_connection()
        due = list(queue.filter(key=self.list_key, lock__lt=timezone.now())[: Conf.BULK])
        return [
            (job.pk, job.payload)
            for job in due
            if queue.filter(id=job.id, lock=job.lock).update(lock=self.timeout(job))
        ]

    def _wait_for_jobs(self) -> bool:
        """Wait up to IDLE_WAIT for a statement that enqueues jobs to commit; False when this
        broker cannot listen (then the caller polls)."""
        listener = self._listening()
        if listener is None:
            return False
        try:
            for _ in listener.notifies(timeout=IDLE_WAIT, stop_after=1):
                pass
        except Exception:  # noqa: BLE001 (a lost connection: poll, and listen again later)
            logger.warning("pusher.listen_lost", exc_info=True)
            self._drop_listener()
            return False
        return True

    def _listening(self):
        if self._listener is not None:
            return self._listener
        database = connections[Conf.ORM]
        if database.vendor != "postgresql" or time.monotonic() - self._broken_at < IDLE_WAIT:
            return None
        try:
            self._listener = raw_connection(database.settings_dict, SESSION_NAME)
            self._listener.execute(f"LISTEN {JOBS_CHANNEL}")
        except Exception:  # noqa: BLE001 (the database is away: poll until it is back)
            logger.warning("pusher.listen_failed", exc_info=True)
            self._drop_listener()
        return self._listener

    def _drop_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except Exception:  # noqa: BLE001, S110 (closing a broken connection)
                pass
        self._listener, self._broken_at = None, time.monotonic()
