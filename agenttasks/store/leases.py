"""The leases of running runs: a worker process's heartbeat refreshes them, in one statement.

A heartbeat changes no status. It never waits for a run row that a transition holds (PostgreSQL:
SKIP LOCKED); such a run keeps its lease until the next beat, and its stop request is read
without a lock. On PostgreSQL the heartbeat talks over a connection of its own, outside the
connection pool: the runs of a process may hold every pooled connection, and their leases must
be renewed all the same.
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, connections
from django.utils import timezone

from ..broker.listen import raw_connection
from ..models import Run, WorkerProcess

RUNS = Run._meta.db_table
WORKERS = WorkerProcess._meta.db_table


class Leases:
    """The heartbeat thread's database: its own connection on PostgreSQL, Django's elsewhere."""

    def __init__(self) -> None:
        self._raw: Any = None

    def _cursor(self) -> Any:
        if connection.vendor != "postgresql":
            return connection.cursor()
        if self._raw is None or self._raw.closed:
            self._raw = raw_connection(connections["default"].settings_dict)
        return self._raw.cursor()

    def close(self) -> None:
        """Let the connection go (a broken one is opened again at the next beat)."""
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        connection.close()

    def beat(self, run_ids: Sequence[str], worker: str, *, refresh: bool) -> dict[str, str]:
        """Return the stop requests of the runs `worker` holds, by id, their leases refreshed with
        `refresh`. A run that is gone, or that another worker holds now, is left out."""
        if not run_ids:
            return {}
        ids = list(run_ids)
        with self._cursor() as cursor:
            if not refresh:
                return _stop_requests(cursor, worker, ids)
            now = timezone.now()
            if connection.vendor == "postgresql":
                cursor.execute(
                    f"WITH held AS (SELECT id FROM {RUNS} WHERE worker = %s AND id = ANY(%s) "
                    f"FOR NO KEY UPDATE SKIP LOCKED) "
                    f"UPDATE {RUNS} AS r SET heartbeat_at = %s FROM held WHERE r.id = held.id "
                    f"RETURNING r.id, r.stop_request",
                    [worker, ids, now],
                )
            else:
                cursor.execute(
                    f"UPDATE {RUNS} SET heartbeat_at = %s "
                    f"WHERE worker = %s AND id IN ({_marks(ids)}) RETURNING id, stop_request",
                    [now, worker, *ids],
                )
            found = dict(cursor.fetchall())
            passed_over = [run_id for run_id in ids if run_id not in found]
            if passed_over:  # held by a transition, or gone: read them without a lock
                found.update(_stop_requests(cursor, worker, passed_over))
            return found

    def report(self, process: str, node: str, slots: int, busy: int, started: datetime) -> None:
        """Record a worker process's slots and the runs it holds in flight."""
        with self._cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {WORKERS} (id, node, slots, busy, started_at, seen_at) "
                f"VALUES (%s, %s, %s, %s, %s, %s) "
                f"ON CONFLICT (id) DO UPDATE SET busy = excluded.busy, seen_at = excluded.seen_at",
                [process, node, slots, busy, started, timezone.now()],
            )


def _stop_requests(cursor: Any, worker: str, ids: list[str]) -> dict[str, str]:
    cursor.execute(
        f"SELECT id, stop_request FROM {RUNS} WHERE worker = %s AND id IN ({_marks(ids)})",
        [worker, *ids],
    )
    return dict(cursor.fetchall())


def _marks(ids: list[str]) -> str:
    return ", ".join(["%s"] * len(ids))
