"""The harness of the lifecycle tests (docs/lifecycle.md#scenarios-cited-by-the-tests): read a task back, and end its runs by hand.

`t` is a task id, a Task or a TaskInfo. `finish()` does what a worker does when a run ends: it
claims the run first when nobody holds it, then hands the outcome to the lifecycle.
"""

from agenttasks import lifecycle, store
from agenttasks.models import Run, Task, Wakeup
from agenttasks.types import RunOutcome, TaskInfo

CURRENT = object()  # finish(): "the task's current run"
WORKER = "w1"


def task_id_of(t) -> str:
    if isinstance(t, TaskInfo):
        return t.task_id
    return getattr(t, "pk", None) or t


def row(t) -> Task:
    """Re-read a task with its conversation and current run."""
    return Task.objects.select_related("run", "conversation").get(pk=task_id_of(t))


def finish(t, status, text="", error="", graceful=False, run_id=CURRENT, **extra) -> Task:
    """End a run of the task (its current one by default; None: an outcome naming no run)."""
    task = row(t)
    target = task.run_id if run_id is CURRENT or run_id is None else run_id
    if target == task.run_id and task.run.status == "queued":
        assert store.claim(target, WORKER), "the claim should win"
    outcome = RunOutcome(
        run_id=task.run_id if run_id is CURRENT else run_id,
        status=status,
        text=text,
        error=error,
        graceful_stop=graceful,
        **extra,
    )
    lifecycle.on_run_finished(task.conversation_id, outcome)
    return row(t)


def fail(t, reason) -> Task:
    return finish(t, "failed", error=reason)


def runs_of(t) -> list[Run]:
    return list(Run.objects.filter(task_id=task_id_of(t)).order_by("created_at", "id"))


def wakeups_of(t) -> list[Wakeup]:
    return list(Wakeup.objects.filter(task_id=task_id_of(t)).order_by("created_at", "id"))
