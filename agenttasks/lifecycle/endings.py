"""A run's ending: pause, continue (the kind's CONTINUE hook) or finalize its task."""

import dataclasses
import logging
from typing import Any

from .. import ids, signals, store
from ..conf import app_settings
from ..delivery import wakeups
from ..exceptions import SpawnError, TaskNotFound
from ..models import Run, Task
from ..states import TERMINAL, OutcomeStatus, RunStatus, StopReason, StopRequest, TaskStatus
from ..store import faults
from ..types import ConversationRef, Ending, RunOutcome, TaskInfo, usage_shape
from .base import check_agent, conversation_id_of, info, read
from .effects import announce, launch, launch_durable, own_run_boundary, resume_if_settled
from .reading import meta_for
from .retries import retry_later

logger = logging.getLogger(__name__)


CEILING_TEXT = "stopped after %d runs: the task's continuation ceiling (%d) was reached"
NO_RUN_ID_WARNING = "task outcome without a run id: Continue not consulted; a job of several runs needs run identity"


def on_run_finished(
    conversation: ConversationRef, outcome: RunOutcome, *, task: Task | None = None
) -> None:
    """Handle a run's ending, the single entry point: pause, continue, or finalize its task.

    The run driver passes the task it claimed (`task`), which saves looking it up again.
    """
    conversation_id = conversation_id_of(conversation)
    if task is None:
        try:
            meta = meta_for(conversation_id)
        except SpawnError:
            logger.error(
                "resolving finished run's task; terminal state NOT recorded conversation=%s",
                conversation_id,
            )
            raise
        if meta is None:
            if outcome.run_id:
                ended = store.record_run_end(outcome.run_id, outcome)
                if ended is not None and ended.status == RunStatus.ROLLED_BACK:
                    from .recovery import forget_rolled_back  # recovery imports this module

                    forget_rolled_back(conversation_id)
                if outcome.status == OutcomeStatus.INPUT_REQUIRED:
                    resume_if_settled(conversation_id)  # its escalated children may have settled
            wakeups.schedule_delivery(conversation_id)
            return
        task = read(meta.task_id)
    run_id = outcome.run_id or task.run_id
    # A run stopped at once reports `cancelled`: it may have been stopped for a newer message.
    if outcome.status == OutcomeStatus.CANCELLED and _hand_over(task, run_id, outcome):
        return
    if outcome.status == OutcomeStatus.PARKED:
        if _park(task, run_id, outcome):
            return
        # Not parked (asked to stop, or moved on): it ends as a run stopped at a turn boundary.
        outcome = dataclasses.replace(outcome, status=OutcomeStatus.COMPLETED, graceful_stop=True)
    if outcome.status == OutcomeStatus.FAILED and retry_later(task, run_id, outcome):
        return
    if outcome.status == OutcomeStatus.INPUT_REQUIRED:
        if _pause(task, run_id, outcome) or not _stopping_after_turn(run_id):
            return
        # The store refused the pause of a run asked to stop after its turn: it ends instead,
        # as a graceful stop (docs/lifecycle.md#pausing-for-a-person), so no action is left open and the stop is honoured.
        outcome = dataclasses.replace(
            outcome,
            status=OutcomeStatus.COMPLETED,
            graceful_stop=True,
            actions=(),
            clarification=None,
        )
    if outcome.status not in TERMINAL:
        return
    hook = app_settings.hook("CONTINUE", task.kind)
    if hook is None:
        _finish(task, run_id, outcome)
    else:
        _finish_with_hook(read(task.id), run_id, outcome, hook)


def _hand_over(task: Task, run_id: str, outcome: RunOutcome) -> bool:
    """Move a task whose run was stopped for a newer message to that message's run; whether
    this ending did (it loses when the task moved or ended meanwhile)."""
    won = store.hand_over(task.id, run_id, outcome)
    if won is None:
        return False
    announce(won)
    if won.status == TaskStatus.PENDING:
        launch_durable(won.run_id)
    if Run.objects.filter(pk=run_id, status=RunStatus.ROLLED_BACK).exists():
        from .recovery import forget_rolled_back  # recovery imports this module

        forget_rolled_back(task.conversation_id)
    return True


def _ending(
    outcome: RunOutcome,
    *,
    graceful: bool,
    status: str | None = None,
    full: str | None = None,
    state: Any = None,
) -> Ending:
    """How an outcome settles its task (a completed run asked to stop after its turn is a
    cancellation that keeps its reply as the result)."""
    if full is None:
        failed = outcome.status == OutcomeStatus.FAILED
        full = outcome.text.strip() or (outcome.error if failed else "")
    status = status or outcome.status
    summary = full[: app_settings.SUMMARY_LIMIT]
    reason = ""
    if status == TaskStatus.COMPLETED and graceful:
        status = TaskStatus.CANCELLED
        summary = summary or StopReason.AFTER_TURN.value
        reason = StopReason.AFTER_TURN
    task_result = None
    if status == TaskStatus.COMPLETED or (status == TaskStatus.CANCELLED and full):
        task_result = outcome.task_result or {"content": full, "metadata": outcome.metadata}
        # The result speaks the API's words whatever the runtime's (the chat runtime's are the
        # model server's: prompt_tokens, …).
        task_result = {**task_result, "usage": usage_shape(task_result.get("usage", outcome.usage))}
    return Ending(
        status=status,
        summary=summary,
        result=full,
        error=outcome.error if status == outcome.status else "",
        state=state,
        task_result=task_result,
        reason=reason,
    )


def _finish(task: Task, run_id: str, outcome: RunOutcome) -> None:
    """Record the ending and finalize at once (a kind without a CONTINUE hook)."""
    ending = _ending(outcome, graceful=outcome.graceful_stop)
    graceful = _ending(outcome, graceful=True)
    after_turn = None if graceful == ending else graceful
    ended = store.end(task.id, run_id, ending, outcome=outcome, after_turn=after_turn)
    _settled(ended.task, task, run_id)


def _finish_with_hook(task: Task, run_id: str, outcome: RunOutcome, hook: Any) -> None:
    """Record the ending, ask the kind's CONTINUE hook, then advance or finalize."""
    graceful = outcome.graceful_stop or (
        task.run_id == run_id and task.run.stop_request == StopRequest.AFTER_TURN
    )
    if graceful and not outcome.graceful_stop:
        outcome = dataclasses.replace(outcome, graceful_stop=True)
    store.record_run_end(run_id, outcome)
    ending = _ending(outcome, graceful=graceful)
    if _wants_continuation(task, run_id, ending.status, outcome):
        if outcome.run_id is None:
            logger.warning(NO_RUN_ID_WARNING)
        else:
            step = _continue(task, run_id, outcome, hook)
            if step is None:
                return
            status, full, final_state = step
            ending = _ending(outcome, graceful=False, status=status, full=full, state=final_state)
    _settled(store.end(task.id, run_id, ending).task, task, run_id)


def _settled(won: Task | None, task: Task, run_id: str) -> None:
    if won:
        announce(won)
    else:
        logger.debug("lifecycle.ending_lost task=%s run=%s", task.id, run_id)
        own_run_boundary(task)


def _pause(task: Task, run_id: str, outcome: RunOutcome) -> bool:
    partial = {
        "content": outcome.text,
        "metadata": outcome.metadata,
        "usage": usage_shape(outcome.usage),
    }
    won = store.pause(
        task.id,
        run_id,
        actions=outcome.actions,
        clarification=outcome.clarification if not outcome.actions else None,
        task_result=partial,
        # No action and no clarification: the run waits on its delegate children's escalations.
        escalated=not outcome.actions and outcome.clarification is None,
    )
    if not won:
        logger.info("lifecycle.pause_lost task=%s run=%s", task.id, run_id)
        return False
    announce(won)
    return True


def _park(task: Task, run_id: str, outcome: RunOutcome) -> bool:
    """Queue the run again until shortly before its place in its provider's line; whether it
    was parked."""
    assert outcome.parked_until is not None and outcome.limited_since is not None
    won = store.park(task.id, run_id, outcome.parked_until, outcome.limited_since)
    if won is None:
        return False
    announce(won)
    launch_durable(run_id)  # the claimers learn when it is due
    return True


def _stopping_after_turn(run_id: str) -> bool:
    return Run.objects.filter(
        pk=run_id, status=RunStatus.RUNNING, stop_request=StopRequest.AFTER_TURN
    ).exists()


def _wants_continuation(task: Task, run_id: str, status: str, outcome: RunOutcome) -> bool:
    return (
        status != TaskStatus.CANCELLED
        and not outcome.graceful_stop
        and task.run_id == run_id
        and task.status == TaskStatus.RUNNING
    )


def _continue(
    task: Task, run_id: str, outcome: RunOutcome, hook: Any
) -> tuple[str | None, str | None, Any] | None:
    """Ask the kind's CONTINUE hook; advance and launch, or return the ending it decided.

    Returns None when the task went on to a next run (or that attempt was settled here), else
    (status, full text, final state) for the ending; None for status and text: the outcome's.
    """
    try:
        cont = hook(task, outcome)
    except Exception as exc:
        return TaskStatus.FAILED, str(exc), None
    if cont is None:
        return None, None, None
    if not cont.input:
        if cont.error:
            return TaskStatus.FAILED, cont.error, cont.state
        return None, None, cont.state
    if task.continuations >= app_settings.MAX_CONTINUATIONS:
        return (
            TaskStatus.FAILED,
            CEILING_TEXT % (task.continuations + 1, app_settings.MAX_CONTINUATIONS),
            None,
        )
    next_run_id = ids.new_run_id()
    try:
        advanced = store.advance(task.id, run_id, next_run_id, input=cont.input, state=cont.state)
        reason = "the task was moved before the next run could start"
    except Exception as exc:
        logger.warning("endings.advance_failed task=%s", task.id, exc_info=True)
        advanced, reason = None, faults.told(exc)
    if not advanced:
        return TaskStatus.FAILED, "could not advance to the next run: " + reason, None
    try:
        check_agent(advanced.agent)
        launch(next_run_id)
    except Exception as exc:
        logger.warning("endings.next_run_not_started task=%s", task.id, exc_info=True)
        text = "could not start the next run: " + faults.told(exc)
        won = store.finalize(
            task.id,
            next_run_id,
            TaskStatus.FAILED,
            summary=text[: app_settings.SUMMARY_LIMIT],
            result=text,
        )
        if won:
            announce(won)
        return None
    announce(advanced)
    return None


def model_has_result(task_info: TaskInfo | None) -> None:
    """Settle the debt of a result the model was handed, bound to its run and attempt."""
    if task_info is None or task_info.status not in TERMINAL:
        return
    try:
        task = read(task_info.task_id)
    except TaskNotFound:
        return
    if (
        task.status not in TERMINAL
        or task.run_id != task_info.run_id
        or task.attempt_no() != task_info.attempt
    ):
        return
    if store.consume_wakeup(task.id, task_info.run_id):
        signals.result_delivered.send(sender=Task, snapshot=task)


def take_owed(conversation: ConversationRef) -> str:
    """Hand a conversation with no agent behind it what its tasks' endings owe it.

    Returns the notification text of every pending wake-up ("" when none) and settles each as
    the model's own pull (`model_has_result`: consumed, bound to its run and attempt). A
    conversation with an agent is woken instead (docs/lifecycle.md#wake-up-debt-and-notifications).
    """
    items = wakeups.owed(conversation_id_of(conversation))
    if not items:
        return ""
    text = wakeups.format_notification(items)
    for item in items:
        try:
            task = read(item.task_id)
        except TaskNotFound:
            continue
        if task.run_id == item.run_id:
            model_has_result(info(task))
    return text


def end_at_deadline(run: Run, error: str) -> bool:
    """End a running run and its task `failed` with `error` (its deadline passed).

    Returns whether this call ended it. A run without a task ends alone and its conversation's
    waiting wake-ups are delivered (docs/lifecycle.md#deadlines).
    """
    outcome = RunOutcome(run.id, TaskStatus.FAILED, error=error, append_message=False)
    if run.task_id is None:
        if store.record_run_end(run.id, outcome) is None:
            return False
        wakeups.schedule_delivery(run.conversation_id)
        return True
    ending = Ending(TaskStatus.FAILED, summary=error, error=error, reason=StopReason.TIMED_OUT)
    ended = store.end(run.task_id, run.id, ending, outcome=outcome)
    if ended.task is not None:
        announce(ended.task)
    logger.info("deadline.reached run=%s task=%s error=%r", run.id, run.task_id, error)
    return ended.recorded or ended.task is not None
