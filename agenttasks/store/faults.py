"""The database's faults as the product tells them: a lost connection, words for the rest, and
the retry that waits out a lost connection (`reconnecting`).

A database's own error text (a host name, a constraint, a statement) is for the log; a task's
error, a callback and an API answer say what failed in the product's words (docs/lifecycle.md).
"""

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

# Its retries are logged as the worker's, where an operator has always looked for them.
logger = logging.getLogger("agenttasks.execution.worker")

UNREACHABLE = "The database could not be reached"
FAILED = "A database error occurred"
T = TypeVar("T")
RECONNECT_WINDOW = 60.0  # seconds a store operation is retried while the database is away


def lost_connection(exc: BaseException | None) -> bool:
    """Say whether `exc`, or an error it was raised from, is the database's being unreachable."""
    while exc is not None:
        if isinstance(exc, (OperationalError, InterfaceError)):
            return True
        exc = exc.__cause__
    return False


def told(exc: BaseException) -> str:
    """Return what an error may tell a task's readers: a database error's detail stays in the log."""
    if lost_connection(exc):
        return UNREACHABLE
    if isinstance(exc, DatabaseError) or isinstance(exc.__cause__, DatabaseError):
        return FAILED
    return str(exc) or type(exc).__name__


def reconnecting(
    write: Callable[[], T],
    *,
    landed: Callable[[], T | None] | None = None,
    window: float = RECONNECT_WINDOW,
) -> T:
    """Call `write`, retrying while the database is unreachable (a restart) for up to `window` s.

    Each store operation is one transaction, so a retry repeats a whole compare-and-set: one that
    committed before the connection broke simply loses the second time. A write that would not
    lose (an append) names `landed`, asked before each retry: what a try whose commit went through
    before its connection broke wrote, or None; the retry returns that instead of writing again.
    A lost connection is retried whatever error a lookup on the way wrapped it in (`SpawnError`
    from `meta_for`).
    """
    deadline = time.monotonic() + window
    delay = 0.2
    tried = False
    while True:
        try:
            if tried and landed is not None:
                done = landed()
                if done is not None:
                    return done
            tried = True
            return write()
        except Exception as exc:
            if (
                not lost_connection(exc)
                or connection.in_atomic_block
                or time.monotonic() > deadline
            ):
                raise
            logger.warning("worker.database_unavailable retry_in=%.1fs", delay, exc_info=True)
            connection.close()
            time.sleep(delay)
            delay = min(delay * 2, 3.0)
