"""Health: is the database reachable, and has any cluster run the reaper lately (docs/rest.md#health).

The reaper records each pass in one row (`ReaperPass`), and each worker process its slots
(`WorkerProcess`), so any web process on any node can tell whether some cluster is alive and
whether every slot is busy. A check is one statement, with details too (it reads the pass, the
slots, the queue and the expired leases).
"""

import os
import socket
import time
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.db import DatabaseError, connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ..conf import app_settings
from ..models import ProviderBudget, ReaperPass, Run, WorkerProcess
from ..states import RunStatus

REAPER = "reaper"
LIMITED_AFTER = 10.0  # seconds: a model endpoint whose next turn is further off is at its limit


def record_pass() -> None:
    """Record that this process finished a reaper pass (one UPDATE; an INSERT the first time)."""
    now = timezone.now()
    node = f"{socket.gethostname()}:{os.getpid()}"
    if not ReaperPass.objects.filter(pk=REAPER).update(node=node, finished_at=now):
        ReaperPass.objects.get_or_create(pk=REAPER, defaults={"node": node, "finished_at": now})


def reaper_window() -> float:
    """Return seconds without a reaper pass after which the service is degraded."""
    return 3 * app_settings.REAP_INTERVAL


def _check_sql(details: bool) -> str:
    """One statement: the last pass, the live worker processes' slots, and with `details` the
    queue and the expired leases."""
    runs, passes = Run._meta.db_table, ReaperPass._meta.db_table
    workers, budgets = WorkerProcess._meta.db_table, ProviderBudget._meta.db_table
    figures = (
        f""",
            (SELECT COUNT(*) FROM {runs} WHERE status = %s),
            (SELECT MIN(queued_at) FROM {runs} WHERE status = %s),
            (SELECT COUNT(*) FROM {runs} WHERE status = %s
                AND (heartbeat_at < %s OR (heartbeat_at IS NULL AND started_at < %s)))"""
        if details
        else ""
    )
    return f"""
        SELECT p.finished_at, p.node, w.processes, w.slots, w.busy,
            (SELECT endpoint FROM {budgets} WHERE next_start > %s
              ORDER BY next_start DESC LIMIT 1),
            (SELECT MAX(next_start) FROM {budgets}){figures}
        FROM (SELECT 1 AS one) AS o LEFT JOIN {passes} AS p ON p.name = %s
        CROSS JOIN (SELECT COUNT(*) AS processes, COALESCE(SUM(slots), 0) AS slots,
                           COALESCE(SUM(busy), 0) AS busy
                      FROM {workers} WHERE seen_at >= %s) AS w
    """


def _aware(value) -> datetime | None:
    """A timestamp from a raw row (SQLite answers text, PostgreSQL a datetime)."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    if parsed is not None and timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=dt_timezone.utc)
    return parsed


def check(*, details: bool) -> tuple[bool, dict]:
    """Return (healthy, body) as `GET /health` answers it; `details` adds the figures."""
    now = timezone.now()
    reasons: list[str] = []
    started = time.perf_counter()
    cutoff = now - timedelta(seconds=app_settings.LEASE_TIMEOUT)
    params: list = [RunStatus.QUEUED, RunStatus.QUEUED, RunStatus.RUNNING, cutoff, cutoff]
    try:
        with connection.cursor() as cursor:
            limited_after = now + timedelta(seconds=LIMITED_AFTER)
            cursor.execute(
                _check_sql(details),
                [limited_after, *(params if details else []), REAPER, cutoff],
            )
            last, node, processes, slots, busy, endpoint, next_start, *figures = cursor.fetchone()
        queued, oldest, expired = figures if details else (None, None, None)
    except DatabaseError as exc:
        return False, {"status": "degraded", "reasons": [f"database unreachable: {exc}".strip()]}
    round_trip = time.perf_counter() - started
    last, oldest = _aware(last), _aware(oldest)
    window = reaper_window()
    if last is None:
        reasons.append("no reaper pass recorded: is a cluster (manage.py qcluster) running?")
    elif (now - last).total_seconds() > window:
        age = round((now - last).total_seconds())
        reasons.append(f"no reaper pass within {format(window, 'g')} s (the last was {age} s ago)")
    body: dict = {"status": "degraded", "reasons": reasons} if reasons else {"status": "ok"}
    slots, busy = int(slots), int(busy)
    if processes and busy >= slots:
        # Not a fault: new runs wait in the queue until a slot frees (docs/rest.md#health).
        body["saturated"] = f"every worker slot is busy ({busy} runs in flight in {slots} slots)"
    next_start = _aware(next_start)
    wait = _age(next_start, now) if next_start is not None else 0.0
    if endpoint is not None:
        # Not a fault either: runs wait their turn (docs/operating.md#meeting-your-providers-limits).
        body["limited"] = (
            f'model endpoint "{endpoint}" is at its limit: a new request waits {wait:g} s'
        )
    if details:
        body["details"] = {
            "database": {"roundTripMs": round(round_trip * 1000, 2)},
            "reaper": {
                "lastPassAgeSeconds": None if last is None else _age(now, last),
                "node": node,
            },
            "queue": {
                "queued": queued,
                "oldestQueuedAgeSeconds": None if oldest is None else _age(now, oldest),
            },
            "leases": {"expired": expired},
            "limits": {"longestWaitSeconds": wait},
            "workers": {
                "processes": processes,
                "slots": slots,
                "inFlight": busy,
                "freeSlots": max(slots - busy, 0),
            },
        }
    return not reasons, body


def _age(now: datetime, then: datetime) -> float:
    return round(max(0.0, (now - then).total_seconds()), 3)
