"""A comment or message to a busy task under a multitask strategy (docs/lifecycle.md#busy-tasks).

A task runs one run at a time, so a newer message that does not wait for the task to finish is
handed to it in one of three ways, under the task's lock (task, conversation, run):

- `steer`: written at once as a `message.steer` event to the queued or running run;
- `enqueue`: a run of the task that waits its turn (`waiting`, its message kept on the row);
  `release_task_waiting` re-opens the task on it once the task could take a comment;
- `interrupt` and `rollback`: the current run is stopped for it. A run that is not executing
  (queued, or paused on an action) ends at once and the task moves to the message's run; a
  running one is told to stop now and the message waits until its worker ends it
  (`hand_over`), so the newer run reads what the stopped one kept.

The task never passes through an ending on the way: it stays live, moving to the newer run as a
comment's re-opening does (`running`/`waiting_for_input` → `pending`).
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ..exceptions import ConversationBusy, TaskNotFound
from ..models import Comment, Event, Run, Task
from ..states import (
    LIVE,
    RUN_ENDED,
    TERMINAL,
    MultitaskStrategy,
    RunStatus,
    RunTrigger,
    StopReason,
    StopRequest,
    TaskStatus,
)
from ..types import Ending, RunOutcome
from .endings import finalize_locked, record_end
from .locking import (
    Log,
    hold_task,
    lock_task,
    retried,
    run_finished,
    task_status,
    user_message_data,
)
from .rollbacks import roll_back
from .rows import cancel_open_actions, move_to_new_run
from .runs import STOPPING, pending_actions_below
from .steering import leave_untaken, steer

STOPPED = StopReason.STOPPED.value
AUTHOR = "authorId"  # kept on a waiting run's message until its comment is written


@dataclass(frozen=True)
class Sent:
    """What a message to a busy task did: `comment` written now (its run queued), or the run
    it waits as (`waiting`), or the run it steered (`event` is its `message.steer`)."""

    task: Task
    run: Run
    comment: Comment | None = None
    event: Event | None = None


def reopenable(task: Task) -> bool:
    """Say whether a locked task can take a comment on a new run now: it ended, or it waits on a
    clarification (its run ended without an action to answer)."""
    clarifying = task.status == TaskStatus.WAITING_FOR_INPUT and task.run.status != RunStatus.PAUSED
    return task.status in TERMINAL or clarifying


@retried
def send_to_busy_task(
    task_id: str,
    content: str,
    *,
    strategy: str,
    fallback: str = MultitaskStrategy.REJECT,
    origin: str = "comment",
    author_id: Any = None,
    metadata: dict[str, Any] | None = None,
    files: list[Any] | None = None,
) -> Sent | None:
    """Hand a message to a task that cannot take it as a comment now; None when it can.

    `strategy` is `enqueue`, `interrupt`, `rollback` or `steer` (module docstring); a steer that
    no run can take (one paused, one being stopped, an action pending) follows `fallback`, and
    a `reject` fallback raises ConversationBusy.
    """
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        if task.conversation.deleting_at is not None:
            raise TaskNotFound(task_id)
        waiting = _waiting(task)
        if reopenable(task) and not waiting:
            return None
        log = Log()
        hold_task(log, task)
        run = task.run
        if strategy == MultitaskStrategy.STEER:
            if _steerable(task, run):
                event = steer(log, run, content, metadata, files)
                log.flush()
                return Sent(task, run, event=event)
            strategy = fallback
        if strategy == MultitaskStrategy.REJECT:
            raise ConversationBusy(task.conversation_id, run_id=task.run_id)
        message = user_message_data(content, origin, files, None, metadata)
        if author_id is not None:
            message[AUTHOR] = author_id
        if strategy in STOPPING and task.status in LIVE:
            for earlier in waiting:  # the newer message replaces what waited behind the run
                earlier.status, earlier.ended_at, earlier.message = RunStatus.CANCELLED, now, None
                earlier.save(update_fields=["status", "ended_at", "message"])
            if run.status == RunStatus.RUNNING:
                run.stop_request = STOPPING[strategy]
                run.save(update_fields=["stop_request"])
            else:
                _stop_now(log, run, STOPPING[strategy], now)
                new = _waiting_run(task, content, message, now)
                comment, event = start_waiting(log, task, new, now)
                log.flush()
                return Sent(task, new, comment=comment, event=event)
        new = _waiting_run(task, content, message, now)
        log.flush()
        return Sent(task, new)


@retried
def hand_over(task_id: str, run_id: str, outcome: RunOutcome) -> Task | None:
    """End a task's run stopped for a newer message and move the task to that message's run.

    Bound to the run: None unless the task is live on `run_id`, running and told to stop for a
    newer message. When that message's run was cancelled meanwhile, the task ends cancelled.
    """
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        run = task.run
        if (
            task.run_id != run_id
            or task.status not in LIVE
            or run.status != RunStatus.RUNNING
            or run.stop_request not in (StopRequest.INTERRUPT, StopRequest.ROLLBACK)
        ):
            return None
        log = Log()
        hold_task(log, task)
        record_end(log, run, outcome, now)
        waiting = _waiting(task)
        if waiting:
            start_waiting(log, task, waiting[0], now)
        else:
            stopped = Ending(TaskStatus.CANCELLED, summary=STOPPED, reason=StopReason.STOPPED)
            finalize_locked(log, task, run_id, stopped, now)
        log.flush()
        return task


@retried
def release_task_waiting(task_id: str) -> Task | None:
    """Re-open a task on its oldest waiting run once it could take a comment; None when it
    cannot yet or nothing waits. Messages steered to its ended run and never read wait first.

    A task a person stopped (cancelled by a stop) keeps it: what waited behind it is cancelled.
    """
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        if task.conversation.deleting_at is not None or not reopenable(task):
            return None
        log = Log()
        hold_task(log, task)
        run = task.run
        if run.status in RUN_ENDED and run.steers > run.steers_taken:
            leave_untaken(log, run, now)
            run.save(update_fields=["steers_taken"])
        waiting = _waiting(task)
        if not waiting:
            log.flush()
            return None
        if task.status == TaskStatus.CANCELLED and task.stop_reason in PERSON_STOPS:
            Run.objects.filter(pk__in=[w.id for w in waiting]).update(
                status=RunStatus.CANCELLED, ended_at=now, message=None
            )
            log.flush()
            return None
        start_waiting(log, task, waiting[0], now)
        log.flush()
        return task


# A task stopped by a person keeps that stop: the messages behind it do not re-open it.
PERSON_STOPS = frozenset(
    {
        StopReason.STOPPED,
        StopReason.WHILE_QUEUED,
        StopReason.WHILE_AWAITING_INPUT,
        StopReason.AFTER_TURN,
    }
)


def start_waiting(log: Log, task: Task, run: Run, now: datetime) -> tuple[Comment, Event]:
    """Make a waiting run of a locked task its current run, queued, its message a comment."""
    data = dict(run.message or {})
    author_id = data.pop(AUTHOR, None)
    comment = Comment.objects.create(
        task=task,
        role=Comment.Role.USER,
        content=data.get("content", ""),
        metadata=data.get("metadata"),
        run_id=run.id,
        author_id=author_id,
    )
    data["commentId"] = comment.id
    run.status, run.queued_at, run.message, run.attempt = (
        RunStatus.QUEUED,
        now,
        None,
        task.attempt_no(),
    )
    run.save(update_fields=["status", "queued_at", "message", "attempt"])
    previous = task.status
    move_to_new_run(task, run, now)
    event = log.add(task.conversation_id, "message.user", data, run_id=run.id, task_id=task.id)
    task_status(log, task, previous)
    task.new_comment = comment
    return comment, event


def _waiting(task: Task) -> list[Run]:
    return list(
        Run.objects.select_for_update(no_key=True)
        .filter(task_id=task.id, status=RunStatus.WAITING)
        .order_by("created_at", "id")
    )


def _waiting_run(task: Task, content: str, message: dict[str, Any], now: datetime) -> Run:
    return Run.objects.create(
        conversation_id=task.conversation_id,
        task_id=task.id,
        owner_id=task.owner_id,
        priority=task.priority,
        agent=task.agent,
        trigger=RunTrigger.MESSAGE if message["origin"] == "message" else RunTrigger.COMMENT,
        input=content,
        attempt=task.attempt_no(),
        status=RunStatus.WAITING,
        queued_at=now,
        message=message,
    )


def _steerable(task: Task, run: Run) -> bool:
    return (
        task.status in (TaskStatus.PENDING, TaskStatus.RUNNING)
        and run.status in (RunStatus.QUEUED, RunStatus.RUNNING)
        and run.stop_request == StopRequest.NONE
        and not pending_actions_below(task.conversation_id).exists()
    )


def _stop_now(log: Log, run: Run, request: str, now: datetime) -> None:
    """End a task's run that is not executing (queued, or paused) for a newer message."""
    run.stop_request = request
    if request == StopRequest.ROLLBACK:
        roll_back(run, now)
    else:
        cancel_open_actions(log, run, now, reason="interrupted")
        leave_untaken(log, run, now)
        run.status, run.ended_at = RunStatus.INTERRUPTED, now
        run_finished(log, run)
    run.save()


# Asked after an ending that did not read it (lifecycle/effects.py; on PostgreSQL agenttasks_end_v3
# reads the same under the task's lock): plain SQL, without the ORM's compiling of a query.
MESSAGES_WAIT = (
    "SELECT 1 FROM agenttasks_run WHERE task_id = %s AND (status = %s OR (status IN ("
    + ", ".join(["%s"] * len(RUN_ENDED))
    + ") AND steers > steers_taken)) LIMIT 1"
)


def messages_wait(task_id: str) -> bool:
    """Say whether messages wait to re-open a task: enqueued (a `waiting` run), or steered to a
    run that ended without reading them (one read of the task's runs)."""
    with connection.cursor() as cursor:
        cursor.execute(MESSAGES_WAIT, [task_id, RunStatus.WAITING, *sorted(RUN_ENDED)])
        return cursor.fetchone() is not None
