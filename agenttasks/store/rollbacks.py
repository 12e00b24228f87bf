"""Rolling back a conversation's run: the `rollback` strategy (docs/lifecycle.md#busy-conversations).

What the run wrote leaves every read of its conversation: its events (the message that started
it among them, so the transcript, `/messages`, the event log and its stream no longer show
them), its approvals and questions, and the files that message brought. The run's row stays,
`rolled_back`, with its usage, for operators and metrics. A wake-up run's notification stays:
the results it carried are delivered, and not the person's words to take back. A task's run
keeps the task's input and its status changes; the comment that started it goes with its
words. The tasks it spawned are the lifecycle's to delete (their trees stop first).
"""

from datetime import datetime

from ..models import Comment, Event, File, PendingAction, Run
from ..states import RunStatus
from .files import remove_stored

# What a rolled-back run leaves: the results a wake-up carried, and a task's own history.
KEPT = ("task.notification", "task.status")


def roll_back(run: Run, now: datetime) -> None:
    """Forget what a locked run of a locked conversation wrote, and end it `rolled_back`."""
    written = Event.objects.filter(conversation_id=run.conversation_id, run_id=run.id)
    task_input = written.filter(type="message.user", data__origin="input").values("pk")
    events = written.exclude(type__in=KEPT).exclude(pk__in=task_input)
    brought = [
        ref["id"]
        for data in events.filter(type="message.user").values_list("data", flat=True)
        for ref in (data or {}).get("files") or []
        if isinstance(ref, dict) and "id" in ref
    ]
    if brought:
        files = File.objects.filter(pk__in=brought, conversation_id=run.conversation_id)
        remove_stored(list(files.values_list("storage_name", flat=True)))
        files.delete()
    events.delete()
    PendingAction.objects.filter(run_id=run.id).delete()
    Comment.objects.filter(run_id=run.id).delete()
    run.status, run.ended_at, run.error, run.message = RunStatus.ROLLED_BACK, now, "", None
    run.steers_taken = run.steers  # what was steered to it is forgotten with the rest
