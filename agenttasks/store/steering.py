"""Steering a conversation's run: the `steer` strategy (docs/lifecycle.md#busy-conversations).

A steered message is written at once, under the conversation's lock, as a `message.steer` event
naming the run it steers, and counted on the run (`steers`). The run takes it in at its next
model turn (a chat agent) or when its handler asks (`ctx.steered()`): the `message.user` (origin
`steer`) appended then puts it in the transcript, and `steers_taken` catches up. A run that ends
with messages it never took in leaves each to a run of its own, waiting its turn, so none is lost;
one interrupted for a newer message puts them in the transcript, where the newer run reads them.
"""

from datetime import datetime
from typing import Any

from django.db import connection, transaction

from ..models import Event, Run
from ..states import RunStatus, RunTrigger, StopRequest
from .locking import Log, lock_run, retried, user_message_data

STEER = "message.steer"


def steer(log: Log, run: Run, content: str, metadata: Any, files: Any) -> Event:
    """Write a message steered to a locked run of a locked conversation."""
    data = user_message_data(content, "steer", files, None, metadata)
    run.steers += 1
    run.save(update_fields=["steers"])
    return log.add(run.conversation_id, STEER, data, run_id=run.id)


@retried
def take_steers(run_id: str) -> list[Event]:
    """Take in the messages steered to a run since it last looked; return their message.user
    events (none: one primary-key read)."""
    if not _has_untaken_steers(run_id):
        return []
    with transaction.atomic():
        run = lock_run(run_id)
        log = Log()
        log.hold(run.conversation)
        taken = [
            log.add(run.conversation_id, "message.user", {**e.data, "steerId": e.id}, run_id=run.id)
            for e in _untaken(run)
        ]
        run.steers_taken = run.steers
        run.save(update_fields=["steers_taken"])
        log.flush()
        return taken


UNTAKEN_STEERS = "SELECT 1 FROM agenttasks_run WHERE id = %s AND steers > steers_taken"


def _has_untaken_steers(run_id: str) -> bool:
    """Say whether messages were steered to a run since it last looked, in one primary-key
    read (a chat run asks at each turn: plain SQL, without the ORM's compiling of a query)."""
    with connection.cursor() as cursor:
        cursor.execute(UNTAKEN_STEERS, [run_id])
        return cursor.fetchone() is not None


def steers_taken(run_id: str) -> int:
    """Return how many of the messages steered to a run it has taken in (0: no such run)."""
    taken = Run.objects.filter(pk=run_id).values_list("steers_taken", flat=True).first()
    return taken or 0


def leave_untaken(log: Log, run: Run, now: datetime) -> None:
    """Settle the messages steered to a locked run that ends and never took them in.

    Interrupted for a newer message, it takes them into the transcript now (that message's run
    reads them); any other ending gives each a run of its own, waiting its turn.
    """
    task_id = run.task_id or ""
    for event in _untaken(run):
        if run.stop_request == StopRequest.INTERRUPT:
            data = {**event.data, "steerId": event.id}
            log.add(run.conversation_id, "message.user", data, run_id=run.id, task_id=task_id)
            continue
        data = {**event.data, "origin": "message"}
        Run.objects.create(
            conversation_id=run.conversation_id,
            task_id=run.task_id,  # a task's waits to re-open it (store/busy_tasks.py)
            owner_id=run.owner_id,
            priority=run.priority,
            agent=run.agent,
            trigger=RunTrigger.MESSAGE,
            input=data.get("content", ""),
            status=RunStatus.WAITING,
            queued_at=now,
            message=data,
        )
    run.steers_taken = run.steers


def _untaken(run: Run) -> list[Event]:
    if run.steers <= run.steers_taken:
        return []
    steered = Event.objects.filter(
        conversation_id=run.conversation_id, type=STEER, run_id=run.id
    ).order_by("seq")
    return list(steered[run.steers_taken :])
