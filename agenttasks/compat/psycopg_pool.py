"""The psycopg pool internal agenttasks depends on: the check a pool runs before it hands out a
connection (psycopg_pool's `_check`; verified against psycopg-pool 3.2 and 3.3).

A database restart ends all of a process's pooled connections at once. Django's pool (with
CONN_HEALTH_CHECKS) checks each before handing it out, but waits 1, 2, 4, 8 s between the dead
ones it finds, so a request could hang for seconds after a restart, or time out the pool.
`drain_when_checks_fail` makes the first failed check drain the pool: the idle connections are
replaced at once and the busy ones when they come back (docs/operating.md#surviving-a-database-restart).
psycopg's pool has no public way to set its check after Django made it; without the attribute
the pool keeps its own behaviour.

The pool's check is a round trip (an empty statement) each time it hands a connection out: for
every web request and for each of a run's turns at the database. A connection the server ended
(a restart, `pg_terminate_backend`) has its goodbye or its end waiting on the socket, so the
round trip is made only for a connection on which something arrived while it was idle.
"""

import select
from typing import Any


def drain_when_checks_fail(sender, connection, **kwargs) -> None:
    """Make a new connection's pool drain itself when its check finds a dead connection.

    Hooked to Django's `connection_created`, which fires each time the pool hands one out.
    """
    pool: Any = getattr(connection, "pool", None)
    check = getattr(pool, "_check", None)
    if pool is None or check is None or getattr(pool, "drains_on_failed_check", False):
        return

    def check_or_drain(conn) -> None:
        if not heard_from(conn):
            return
        try:
            check(conn)
        except Exception:
            pool.drain()
            raise

    pool._check = check_or_drain
    pool.drains_on_failed_check = True


def heard_from(conn) -> bool:
    """Say whether anything arrived on an idle connection (or it is closed): an idle connection
    of a live server has nothing to read."""
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except Exception:  # closed: fileno() raises
        return True
