"""How runs end and tasks settle: record a run's ending, finalize its task, or both at once.

`end` is the one finalize of the app: a run's ending reported by its worker, a stop, the
reaper's orphans, a lapsed action and a retry that could not start all go through it. On
PostgreSQL it is one statement (the `agenttasks_end_v3` SQL function); elsewhere the same steps
run through the ORM in one transaction.
"""

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..exceptions import RunNotFound
from ..models import Run, Task
from ..states import (
    LIVE,
    RUN_ENDED,
    STOPPED_AS,
    OutcomeStatus,
    RunStatus,
    StopRequest,
    TaskStatus,
)
from ..types import Ended, Ending, RunOutcome, usage_counts
from . import postgres
from .debts import owes_wakeup, write_debt
from .locking import Log, hold_task, lock_run, lock_task, retried, run_finished, task_status
from .rollbacks import roll_back
from .rows import (
    cancel_open_actions,
    create_actions,
    end_run,
    save_task,
    set_status,
    write_result,
)
from .steering import leave_untaken

ORPHAN_TEXT = "The server stopped while the task was running"


@retried
def end(
    task_id: str,
    run_id: str,
    ending: Ending,
    *,
    outcome: RunOutcome | None = None,
    after_turn: Ending | None = None,
    lease_cutoff: datetime | None = None,
    rollback_attempt: bool = False,
) -> Ended:
    """Record how the run ended (with `outcome`) and settle its task with `ending`.

    - The finalize is bound to the run: it loses unless the task is live on `run_id`.
    - `after_turn` replaces `ending` when the run was asked to stop after its turn.
    - `lease_cutoff` makes it the reaper's: only a running run silent since then is ended.
    - `rollback_attempt` gives back the attempt of a retry whose run could not start.
    """
    if postgres.enabled():
        return postgres.end(
            task_id,
            run_id,
            ending,
            outcome=outcome,
            after_turn=after_turn,
            lease_cutoff=lease_cutoff,
            rollback_attempt=rollback_attempt,
        )
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        log = Log()
        ended = _end_locked(
            log, task, run_id, ending, outcome, after_turn, lease_cutoff, rollback_attempt, now
        )
        log.flush()
    return ended


def _end_locked(
    log: Log,
    task: Task,
    run_id: str,
    ending: Ending,
    outcome: RunOutcome | None,
    after_turn: Ending | None,
    lease_cutoff: datetime | None,
    rollback_attempt: bool,
    now: datetime,
) -> Ended:
    if task.run_id != run_id:
        # The task has moved to another run: only this run's own ending is recorded.
        recorded = outcome is not None and _record_left_run(log, run_id, outcome, now)
        return Ended(recorded=recorded, task=None)
    run = task.run
    if lease_cutoff is not None and not orphaned(task, run, lease_cutoff):
        return Ended(recorded=False, task=None)
    recorded = False
    if outcome is not None and run.status in (RunStatus.RUNNING, RunStatus.PAUSED):
        hold_task(log, task)
        record_end(log, run, outcome, now)
        recorded = True
    if after_turn is not None and run.stop_request == StopRequest.AFTER_TURN:
        ending = after_turn
    won = finalize_locked(log, task, run_id, ending, now, rollback_attempt=rollback_attempt)
    return Ended(recorded=recorded, task=won)


def _record_left_run(log: Log, run_id: str, outcome: RunOutcome, now: datetime) -> bool:
    try:
        run = lock_run(run_id)
    except RunNotFound:
        return False  # as agenttasks_end_v2 answers: nothing of an unknown run to record
    if run.status not in (RunStatus.RUNNING, RunStatus.PAUSED):
        return False
    log.hold(run.conversation)
    record_end(log, run, outcome, now)
    return True


def orphaned(task: Task, run: Run, cutoff: datetime) -> bool:
    """Say whether the locked task runs on `run`, silent since `cutoff` (its worker died)."""
    seen = run.heartbeat_at if run.heartbeat_at is not None else run.started_at
    return (
        task.status == TaskStatus.RUNNING
        and run.status == RunStatus.RUNNING
        and task.conversation.deleting_at is None
        and seen is not None
        and seen < cutoff
    )


def record_end(log: Log, run: Run, outcome: RunOutcome, now: datetime) -> None:
    """Write a locked run's ending: its status, output and usage, and its events."""
    counts = usage_counts(outcome.usage)
    if counts is not None:
        run.usage_known = True
        run.prompt_tokens, run.completion_tokens, run.total_tokens = counts
    if run.stop_request == StopRequest.ROLLBACK:
        roll_back(run, now)  # what it reports is forgotten with the rest
        run.output = ""
        run.save()
        return
    if run.status == RunStatus.PAUSED and outcome.status != OutcomeStatus.INPUT_REQUIRED:
        cancel_open_actions(log, run, now)  # a paused run that ends leaves nothing open
    if outcome.text and outcome.append_message:
        data: dict[str, Any] = {"content": outcome.text}
        if counts is not None:
            data["usage"] = run.usage
        log.add(
            run.conversation_id, "message.assistant", data, run_id=run.id, task_id=run.task_id or ""
        )
    run.output, run.graceful_stop, run.ended_at = outcome.text, outcome.graceful_stop, now
    if outcome.status == OutcomeStatus.INPUT_REQUIRED and run.task_id is None:
        # A conversation run pauses the way `pause` pauses a task's run.
        run.status, run.ended_at = RunStatus.PAUSED, None
        create_actions(log, run, outcome.actions, now)
    elif run.stop_request in STOPPED_AS:
        # Told to stop now: whatever it reports afterwards is a late ending, discarded. A stop
        # for a newer message ends it `interrupted` (the `interrupt` strategy).
        run.status, run.error = STOPPED_AS[run.stop_request], ""
        run_finished(log, run)
    else:
        run.status = outcome.status if outcome.status in RUN_ENDED else RunStatus.COMPLETED
        run.error = outcome.error if run.status == RunStatus.FAILED else ""
        run_finished(log, run)
    if run.status != RunStatus.PAUSED:
        leave_untaken(log, run, now)  # what was steered to it and never read is not lost
    run.save()


def finalize_locked(
    log: Log,
    task: Task,
    run_id: str,
    ending: Ending,
    now: datetime,
    *,
    rollback_attempt: bool = False,
) -> Task | None:
    """Settle a locked task that is live on `run_id`: completed, failed or cancelled."""
    if task.status not in LIVE or task.run_id != run_id:
        return None
    hold_task(log, task)
    run = task.run
    failed = ending.status == TaskStatus.FAILED
    error = (ending.error or ending.result) if failed else ""
    if run.status in (RunStatus.QUEUED, RunStatus.PAUSED):
        end_run(log, run, ending.status, now, error=error)
    elif run.status == RunStatus.RUNNING and run.stop_request != StopRequest.NOW:
        # Ended from outside (a stop, the reaper, a timeout): the worker aborts.
        run.stop_request = StopRequest.NOW
        run.save(update_fields=["stop_request"])
    previous = task.status
    set_status(task, ending.status)
    task.summary = ending.summary or task.summary
    task.result = ending.result or task.result
    task.error = error
    if ending.state is not None:
        task.state = ending.state
    task.stop_reason = ending.reason
    task.finished_at = now
    fields = ["status", "summary", "result", "error", "state", "stop_reason", "finished_at"]
    if rollback_attempt:
        task.attempt = max(task.attempt_no() - 1, 1)
        fields.append("attempt")
    save_task(task, fields, now)
    if ending.task_result is not None:
        write_result(task, run_id, ending.task_result)
    if ending.status != TaskStatus.CANCELLED and owes_wakeup(task):
        write_debt(task, run_id, ending.status)
    task_status(log, task, previous, ending.reason)
    return task


@retried
def finalize(task_id: str, run_id: str, status: str, **fields: Any) -> Task | None:
    """End a live task on its current run with `Ending(status, **fields)`; None if it lost."""
    if status not in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED):
        raise ValueError(f"finalize needs a terminal status, not {status!r}")
    return end(task_id, run_id, Ending(status, **fields)).task


@retried
def record_run_end(run_id: str, outcome: RunOutcome) -> Run | None:
    """Record how a running (or paused) run ended, leaving its task (if any) as it is."""
    now = timezone.now()
    with transaction.atomic():
        run = lock_run(run_id)
        if run.status not in (RunStatus.RUNNING, RunStatus.PAUSED):
            return None
        log = Log()
        log.hold(run.conversation)
        record_end(log, run, outcome, now)
        log.flush()
        return run


@retried
def release_retry_claim(task_id: str, run_id: str, summary: str, result: str) -> Task | None:
    """Give back a retry whose run could not start: failed again, the attempt rolled back."""
    ending = Ending(TaskStatus.FAILED, summary=summary, result=result, error=result)
    return end(task_id, run_id, ending, rollback_attempt=True).task
