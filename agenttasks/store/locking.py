"""Row locks in the documented order, and the event log a transition appends to.

Lock order, always (children before parents, so no two writers wait on each other in a circle):
the principal's advisory lock (slot-taking writes only); the task; its own conversation; its
current run; the parent conversation; then actions and wake-ups. A run without a task is guarded
by its conversation's row, taken before the run's. Inserting an event moves the conversation's
`last_seq` by a database trigger, so the next seq is read from the conversation row the writer
holds.
"""

import functools
import random
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, ParamSpec, TypeVar

from django.db import OperationalError, transaction
from django.db.models import Model, QuerySet

from ..broker.listen import conversation_key, hub
from ..exceptions import ConversationNotFound, RunNotFound, TaskNotFound
from ..models import Conversation, Event, PendingAction, Run, Task
from ..states import TaskStatus

P = ParamSpec("P")
R = TypeVar("R")
_M = TypeVar("_M", bound=Model)
# PostgreSQL's deadlock_detected and serialization_failure: the transaction was chosen to lose
# and rolled back whole, so running it again is safe.
RETRIED_STATES = {"40P01", "40001"}
ATTEMPTS = 4


def is_retryable(exc: BaseException) -> bool:
    """Say whether PostgreSQL rolled the transaction back as a deadlock (or serialization) victim."""
    return getattr(exc.__cause__, "sqlstate", None) in RETRIED_STATES


def retried(write: Callable[P, R]) -> Callable[P, R]:
    """Run a store write again, up to ATTEMPTS times, when it lost a deadlock.

    The lock order keeps the store's own transactions from deadlocking one another; this is for
    what the order cannot cover (a site's transaction around a store call, foreign-key checks).
    Inside a caller's transaction the caller's whole transaction was lost, so it is not retried
    here: the caller's own retry (the keyed request's, say) runs it again.
    """

    @functools.wraps(write)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if transaction.get_connection().in_atomic_block:
            return write(*args, **kwargs)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return write(*args, **kwargs)
            except OperationalError as exc:
                if attempt == ATTEMPTS or not is_retryable(exc):
                    raise
                time.sleep(random.uniform(0, 0.02 * 2**attempt))  # let the winner finish
        raise AssertionError("unreachable")

    return run


class Log:
    """Events appended in the current transaction, numbered from the locked conversations."""

    def __init__(self) -> None:
        self.rows: list[Event] = []
        self._seq: dict[str, int] = {}

    def hold(self, conversation: Conversation) -> None:
        """Number this conversation's events after its seq (its row must be locked)."""
        self._seq.setdefault(conversation.id, conversation.last_seq)

    def holds(self, conversation_id: str | None) -> bool:
        return conversation_id in self._seq

    def add(
        self,
        conversation_id: str,
        type: str,
        data: dict[str, Any],
        *,
        run_id: str = "",
        task_id: str = "",
    ) -> Event:
        seq = self._seq[conversation_id] + 1
        self._seq[conversation_id] = seq
        event = Event(
            conversation_id=conversation_id,
            seq=seq,
            type=type,
            run_id=run_id or "",
            task_id=task_id or "",
            data=data,
        )
        self.rows.append(event)
        return event

    def flush(self) -> None:
        if self.rows:
            Event.objects.bulk_create(self.rows)
            announce_events({row.conversation_id for row in self.rows})
            self.rows = []


def announce_events(conversation_ids: Iterable[str]) -> None:
    """Wake this process's stream readers at commit (other processes hear NOTIFY, or poll)."""
    for conversation_id in conversation_ids:
        transaction.on_commit(partial(hub.publish, conversation_key(conversation_id)))


# --- locks -----------------------------------------------------------------------------------


def one(rows: QuerySet[_M]) -> _M | None:
    """Return the row a lookup by a unique key finds, or None: first() without the ORDER BY it
    adds, whose compiling took a third of a lock's statement with its joins."""
    return next(iter(rows.order_by()[:1]), None)


def _task_rows() -> QuerySet[Task]:
    return Task.objects.select_related("conversation", "run").select_for_update(
        no_key=True, of=("self", "conversation", "run")
    )


def lock_task(task_id: str) -> Task:
    """Lock a task with its conversation and current run (in the caller's transaction)."""
    while True:
        task = one(_task_rows().filter(pk=task_id))
        if task is not None:
            return task
        # On PostgreSQL a statement that waited for the lock re-checks the join with the rows it
        # locked: if the writer it waited for moved the task to a new run, the old run no longer
        # joins and the task looks absent. A new statement sees the committed state.
        if not Task.objects.filter(pk=task_id).exists():
            raise TaskNotFound(task_id)


def lock_task_of_run(run_id: str) -> Task | None:
    """Lock the task whose current run this is, with its conversation and run; None if none."""
    return one(_task_rows().filter(run_id=run_id))


def lock_run(run_id: str) -> Run:
    """Lock a run with its conversation (whose row guards a run that has no task)."""
    run = one(
        Run.objects.select_related("conversation")
        .select_for_update(no_key=True, of=("conversation", "self"))
        .filter(pk=run_id)
    )
    if run is None:
        raise RunNotFound()
    return run


def lock_conversation(conversation_id: str, log: Log | None = None) -> Conversation:
    """Lock a conversation row; hold it in `log` for numbering its events."""
    conversation = one(
        Conversation.objects.select_for_update(no_key=True).filter(pk=conversation_id)
    )
    if conversation is None:
        raise ConversationNotFound(conversation_id)
    if log is not None:
        log.hold(conversation)
    return conversation


def lock_open_action(action_id: str) -> PendingAction | None:
    """Lock an action that is still pending; None when it is gone or already settled."""
    return one(PendingAction.objects.select_for_update().open().filter(pk=action_id))


def hold_task(log: Log, task: Task, *, parent: bool = True) -> None:
    """Hold the task's conversation (already locked) and, when asked, lock its parent's."""
    log.hold(task.conversation)
    if parent and task.parent_conversation_id and not log.holds(task.parent_conversation_id):
        parent_row = one(
            Conversation.objects.select_for_update(no_key=True).filter(
                pk=task.parent_conversation_id
            )
        )
        if parent_row is not None:
            log.hold(parent_row)


# --- events ----------------------------------------------------------------------------------


def task_status_data(task: Task, previous: str | None, reason: str = "") -> dict[str, Any]:
    """Return the data of a task.status event: where the task went, on which run and attempt."""
    data: dict[str, Any] = {"taskId": task.id}
    if previous is not None:
        data["from"] = previous
    data.update({"to": task.status, "runId": task.run_id, "attempt": task.attempt_no()})
    if task.status == TaskStatus.FAILED and task.error:
        data["error"] = task.error
    if reason:
        data["reason"] = reason
    return data


def task_status(log: Log, task: Task, previous: str | None, reason: str = "") -> None:
    """Append the task.status event to the task's log and mirror it to its parent's."""
    data = task_status_data(task, previous, reason)
    log.add(task.conversation_id, "task.status", data, run_id=task.run_id, task_id=task.id)
    if task.parent_conversation_id is not None and log.holds(task.parent_conversation_id):
        log.add(
            task.parent_conversation_id,
            "task.status",
            dict(data),
            run_id=task.run_id,
            task_id=task.id,
        )


def run_finished(log: Log, run: Run) -> None:
    """Append the run.finished event of an ended run."""
    data: dict[str, Any] = {"status": run.status}
    if run.error:
        data["error"] = run.error
    if run.usage is not None:
        data["usage"] = run.usage
    log.add(run.conversation_id, "run.finished", data, run_id=run.id, task_id=run.task_id or "")


def user_message(
    log: Log,
    conversation_id: str,
    content: str,
    origin: str,
    *,
    run_id: str = "",
    task_id: str = "",
    files: list[dict[str, Any]] | None = None,
    comment_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Event:
    """Append a message.user event."""
    data = user_message_data(content, origin, files, comment_id, metadata)
    return log.add(conversation_id, "message.user", data, run_id=run_id, task_id=task_id)


def user_message_data(
    content: str,
    origin: str,
    files: list[dict[str, Any]] | None = None,
    comment_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the data of a message.user event."""
    data: dict[str, Any] = {"content": content, "origin": origin}
    if files:
        data["files"] = files
    if comment_id:
        data["commentId"] = comment_id
    if metadata:
        data["metadata"] = metadata
    return data
