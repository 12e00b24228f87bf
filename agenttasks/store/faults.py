"""The database's faults as the product tells them: a lost connection, and words for the rest.

A database's own error text (a host name, a constraint, a statement) is for the log; a task's
error, a callback and an API answer say what failed in the product's words (docs/lifecycle.md).
"""

from django.db import DatabaseError, InterfaceError, OperationalError

UNREACHABLE = "The database could not be reached"
FAILED = "A database error occurred"


def lost_connection(exc: BaseException | None) -> bool:
    """Say whether `exc`, or an error it was raised from, is the database's being unreachable."""
    while exc is not None:
        if isinstance(exc, (OperationalError, InterfaceError)):
            return True
        exc = exc.__cause__
    return False


def drain_when_checks_fail(sender, connection, **kwargs) -> None:
    """Make a connection's pool drain itself when its check finds a dead connection.

    A restart ends all of a process's pooled connections at once. Django's pool (with
    CONN_HEALTH_CHECKS) checks each before handing it out, but waits 1, 2, 4, 8 s between the
    dead ones it finds, so a request could hang for seconds after a restart. Draining at the
    first dead one replaces the idle ones at once and discards the busy ones when they return.
    Hooked to `connection_created`; psycopg's pool has no public way to set its check.
    """
    pool = getattr(connection, "pool", None)
    check = getattr(pool, "_check", None)
    if check is None or getattr(check, "drains", False):
        return

    def check_or_drain(conn) -> None:
        try:
            check(conn)
        except Exception:
            pool.drain()
            raise

    check_or_drain.drains = True
    pool._check = check_or_drain


def told(exc: BaseException) -> str:
    """Return what an error may tell a task's readers: a database error's detail stays in the log."""
    if lost_connection(exc):
        return UNREACHABLE
    if isinstance(exc, DatabaseError) or isinstance(exc.__cause__, DatabaseError):
        return FAILED
    return str(exc) or type(exc).__name__
