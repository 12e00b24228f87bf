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


def told(exc: BaseException) -> str:
    """Return what an error may tell a task's readers: a database error's detail stays in the log."""
    if lost_connection(exc):
        return UNREACHABLE
    if isinstance(exc, DatabaseError) or isinstance(exc.__cause__, DatabaseError):
        return FAILED
    return str(exc) or type(exc).__name__
