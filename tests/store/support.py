"""What the store's tests share: a spawned, started or failed task, and the statements a call ran."""

from agenttasks import store
from agenttasks.models import Task
from agenttasks.types import ActionRequest, NewTask

APPROVAL = ActionRequest(
    kind="approval", tool_name="deploy", tool_call_id="call-1", args={"env": "prod"}
)


def spawn(parent, *, cap=None, **kw):
    kw.setdefault("agent", "worker")
    kw.setdefault("input", "do it")
    kw.setdefault("label", "job")
    new = NewTask(parent_conversation_id=parent.pk, owner=parent.owner, **kw)
    return store.create_task(new, parent_cap=cap)


def started(parent, **kw):
    """A spawned task whose run a live worker holds."""
    task = spawn(parent, **kw)
    assert store.claim(task.run_id, "w1")
    return Task.objects.get(pk=task.pk)


def failed(parent, reason="rate limited", **kw):
    task = started(parent, **kw)
    assert store.finalize(task.id, task.run_id, "failed", summary=reason, result=reason)
    return Task.objects.get(pk=task.pk)


def reload(task):
    return Task.objects.select_related("run", "conversation").get(pk=task.pk)


def statements(captured):
    """The captured SQL statements, without transaction control."""
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")
    return [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(control)]
