"""Stopping tasks: now or after the current turn, a client's cancel, and whole task trees."""

import logging
import sys
import time

from django.db import DatabaseError

from .. import store
from ..exceptions import AlreadyFinal, StoreError, TaskNotFound
from ..models import Task
from ..states import LIVE, TERMINAL, StopReason, TaskStatus
from ..types import ConversationRef, StopOutcome, TaskInfo
from .base import conversation_id_of, info, read
from .effects import announce
from .reading import STATUS_POLL

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import ExceptionGroup

logger = logging.getLogger(__name__)


STOP_SETTLE_WAIT = 2.0
STOP_PASSES = 2


def stop(task_id: str, *, graceful: bool = False) -> TaskInfo:
    """Stop a task: at most two passes, the second chasing one retry that replaced the first."""
    return _stop(task_id, graceful)[0]


def _stop(task_id: str, graceful: bool) -> tuple[TaskInfo, bool]:
    """Stop a task; also say whether this call's write ended it (its compare-and-set won)."""
    for pass_no in range(1, STOP_PASSES + 1):
        task = read(task_id)
        if task.status in TERMINAL:
            if pass_no == 1:
                raise AlreadyFinal(task.status, task_id=task.id, info=info(task))
            return info(task), False
        if task.status == TaskStatus.WAITING_FOR_INPUT:
            won = store.finalize(
                task.id,
                task.run_id,
                TaskStatus.CANCELLED,
                summary="stopped while awaiting approval",
                reason=StopReason.WHILE_AWAITING_INPUT,
            )
        else:
            outcome = store.request_stop(task.id, task.run_id, graceful=graceful)
            if outcome is StopOutcome.MOVED:
                continue
            if outcome is StopOutcome.AFTER_TURN:
                announce(task)
                return info(task), False
            if outcome is StopOutcome.ALREADY_FINISHED and pass_no == 1:
                _settle(task)
                continue
            reason = (
                StopReason.STOPPED if outcome is StopOutcome.CANCELLED else StopReason.WHILE_QUEUED
            )
            won = store.finalize(
                task.id, task.run_id, TaskStatus.CANCELLED, summary="stopped", reason=reason
            )
        if won:
            announce(won)
            _stop_children(won)
            return info(read(task_id)), True
    return info(read(task_id)), False


def cancel(task_id: str, *, graceful: bool = False, sole: bool = False) -> Task:
    """Cancel a task for a client; return it as the stop left it (graceful: still winding down).

    Cancelling a cancelled task changes nothing; a task that completed or failed, before or
    during the stop, refuses with AlreadyFinal. `sole` (A2A's CancelTask): a task another stop
    cancelled, before or during this one, refuses too, so that of concurrent cancels only the
    one whose write ended the task succeeds.
    """
    task = read(task_id)
    ended_here = False
    if task.status in LIVE:
        try:
            ended_here = _stop(task.id, graceful)[1]
        except AlreadyFinal:
            pass  # it ended meanwhile: judged below as it is now
        task = Task.objects.select_related("run").get(pk=task.id)
    cancelled_elsewhere = task.status == TaskStatus.CANCELLED and not ended_here
    if task.status in (TaskStatus.COMPLETED, TaskStatus.FAILED) or (sole and cancelled_elsewhere):
        raise AlreadyFinal(task.status, task_id=task.id, info=info(task))
    return task


def _settle(task: Task) -> None:
    """Give a recorded ending up to 2 s to be applied by its worker."""
    deadline = time.monotonic() + STOP_SETTLE_WAIT
    while time.monotonic() < deadline:
        time.sleep(STATUS_POLL)
        now = read(task.id)
        if now.status in TERMINAL or now.run_id != task.run_id:
            return


def _stop_children(task: Task) -> None:
    try:
        stop_tree(task.conversation_id)
    except Exception:
        logger.exception("lifecycle.stop_children_failed task=%s", task.id)


def stop_tree(conversation: ConversationRef) -> None:
    """Stop every live task spawned from the conversation, and theirs, recursively."""
    conversation_id = conversation_id_of(conversation)
    errors: list[Exception] = []
    levels = Task.objects.live().only("id", "conversation_id").levels_below([conversation_id])
    while True:
        try:
            level = next(levels, None)
        except DatabaseError as exc:
            raise StoreError.listing_live(exc) from exc
        if level is None:
            break
        for task in level:
            try:
                stop(task.id)
            except (AlreadyFinal, TaskNotFound):
                pass
            except Exception as exc:  # collected and raised together
                errors.append(exc)
    if errors:
        raise ExceptionGroup("tasks: stopping the task tree", errors)
