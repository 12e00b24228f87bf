"""The limits a new run must fit in: the user's active tasks and the parent's live tasks.

A user's active tasks are the live tasks they own, whoever created them (REST, the Python API,
the admin, or a model in one of their conversations), except delegate tasks (their caller's run
drives them) and tasks in a tree being deleted. Checked under the user's advisory lock on
PostgreSQL (SQLite's IMMEDIATE transactions already serialize every writer), taken first of all
locks and held only until the checking transaction commits.
"""

from django.db import connection

from ..exceptions import ActiveTaskLimit
from ..models import Task
from ..states import TaskKind

PRINCIPAL_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('agenttasks:principal:' || %s, 0))"


def lock_principal(owner_id: int | None) -> None:
    """Serialize one user's slot-taking writes until the caller's transaction commits."""
    if not connection.in_atomic_block:
        raise RuntimeError("lock_principal needs the caller's transaction")
    if connection.vendor == "postgresql" and owner_id is not None:
        with connection.cursor() as cursor:
            cursor.execute(PRINCIPAL_LOCK, [str(owner_id)])


def active_count(owner_id: int | None) -> int:
    """Count the user's active tasks (see the module's rule)."""
    return (
        Task.objects.filter(owner_id=owner_id)
        .live()
        .visible()
        .exclude(kind=TaskKind.DELEGATE)
        .count()
    )


def over_limit(owner_id: int | None, limit: int) -> bool:
    """Say whether one more active task would take the user past `limit` (0 = no limit)."""
    return bool(limit) and owner_id is not None and active_count(owner_id) >= limit


def check_active_limit(owner_id: int | None, limit: int) -> None:
    """Lock the user's slots and refuse one more active task at `limit` (0 = no limit)."""
    if not limit or owner_id is None:
        return
    lock_principal(owner_id)
    if active_count(owner_id) >= limit:
        raise ActiveTaskLimit(limit)


def live_count(conversation_id: str) -> int:
    """Count the live tasks a conversation spawned (delegates do not count)."""
    return Task.objects.spawned_from(conversation_id).live().count()
