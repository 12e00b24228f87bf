"""The readable timeline of a conversation's event log (docs/rest.md#event-types)."""

from dataclasses import dataclass, field

from django.contrib.auth import get_user_model

from ..models import Event
from ..states import ActionStatus, RunStatus, TaskStatus
from .base import human_duration, pretty_json, usage_text

LIMIT = 1000  # newest events shown; the Events changelist has the rest


@dataclass
class Entry:
    """One event, ready for the template."""

    event: Event
    title: str
    css: str
    text: str = ""  # shown as pre-wrapped prose
    detail: object = None  # shown as JSON in <pre>
    meta: list[str] = field(default_factory=list)
    status: str = ""  # a status the entry shows as a badge
    status_label: str = ""
    other_task: str = ""  # a task (other than the page's) the event is about

    @property
    def raw(self) -> str:
        return pretty_json(self.event.data)

    @property
    def detail_json(self) -> str:
        return pretty_json(self.detail) if self.detail is not None else ""


def entries(conversation, *, task_id: str = "") -> tuple[list[Entry], int]:
    """Return the newest events of a conversation as timeline entries, and how many are hidden."""
    first = max(conversation.last_seq - LIMIT, 0)
    events = list(
        Event.objects.filter(conversation_id=conversation.pk, seq__gt=first).order_by("seq")
    )
    users = _deciders(events)
    return [_entry(e, users, task_id) for e in events], first


def _deciders(events) -> dict[str, str]:
    ids = {
        e.data.get("decidedBy")
        for e in events
        if e.type == "action.resolved" and e.data.get("decidedBy")
    }
    if not ids:
        return {}
    return {str(u.pk): str(u) for u in get_user_model().objects.filter(pk__in=ids)}


def _entry(event: Event, users: dict[str, str], task_id: str) -> Entry:
    data = event.data or {}
    render = _RENDERERS.get(event.type, _unknown)
    entry = render(event, data, users)
    if event.task_id and event.task_id != task_id:
        entry.other_task = event.task_id
    return entry


def _label(choices, value: str) -> str:
    """Return a status's display label ('waiting for input'), or the value itself if unknown."""
    try:
        return choices(value).label
    except ValueError:
        return value


def _user_message(event, data, users):
    entry = Entry(event, "User message", "user", text=data.get("content", ""))
    entry.meta.append(data.get("origin", ""))
    if data.get("files"):
        entry.detail = data["files"]
    return entry


def _assistant_message(event, data, users):
    entry = Entry(event, "Assistant", "assistant", text=data.get("content", ""))
    if data.get("usage"):
        entry.meta.append(usage_text(data["usage"]))
    return entry


def _tool_call(event, data, users):
    return Entry(
        event,
        f"Tool call: {data.get('toolName', '?')}",
        "tool",
        detail=data.get("args"),
        meta=[data.get("toolCallId", "")],
    )


def _tool_result(event, data, users):
    entry = Entry(
        event,
        f"Tool result: {data.get('toolName', '?')}",
        "tool-error" if data.get("isError") else "tool",
        text=data.get("content", ""),
        meta=[data.get("toolCallId", "")],
    )
    if data.get("isError"):
        entry.meta.append("error")
    return entry


def _action_requested(event, data, users):
    action = data.get("action") or {}
    kind = action.get("kind", "action")
    title = "Approval requested" if kind == "approval" else "Question asked"
    entry = Entry(event, f"{title}: {action.get('toolName', '?')}", "action")
    entry.text = action.get("prompt", "")
    entry.detail = action.get("args") if kind == "approval" else action.get("questions")
    entry.meta.append(action.get("id", ""))
    if action.get("expiresAt"):
        entry.meta.append(f"expires {action['expiresAt']}")
    return entry


def _action_resolved(event, data, users):
    status = data.get("status", "")
    label = _label(ActionStatus, status)
    entry = Entry(event, f"{data.get('kind', 'action').capitalize()} {label}", "action")
    entry.status, entry.status_label = status, label
    entry.meta.append(data.get("actionId", ""))
    decided_by = data.get("decidedBy")
    if decided_by:
        entry.meta.append(f"by {users.get(str(decided_by), decided_by)}")
    entry.text = data.get("comment", "")
    entry.detail = data.get("answers")
    return entry


def _task_status(event, data, users):
    previous, to = data.get("from"), data.get("to", "")
    label = _label(TaskStatus, to)
    title = f"Status {_label(TaskStatus, previous)} → {label}" if previous else f"Created: {label}"
    entry = Entry(event, title, "status", status=to, status_label=label)
    entry.meta.append(f"attempt {data.get('attempt', 1)}")
    if data.get("reason"):
        entry.meta.append(data["reason"])
    entry.text = data.get("error", "")
    return entry


def _progress(event, data, users):
    return Entry(
        event, "Progress", "progress", text=data.get("progress", ""), detail=data.get("state")
    )


def _notification(event, data, users):
    entry = Entry(event, "Notification", "notification", text=data.get("content", ""))
    entry.meta.extend(data.get("taskIds") or [])
    return entry


def _callback(event, data, users):
    delivered = event.type == "callback.delivered"
    entry = Entry(
        event,
        f"Callback {'delivered' if delivered else 'failed'} ({data.get('status', '?')})",
        "callback" if delivered else "callback-failed",
        text=data.get("error", ""),
    )
    if data.get("httpStatus") is not None:
        entry.meta.append(f"HTTP {data['httpStatus']}")
    if data.get("durationMs") is not None:
        entry.meta.append(human_duration(data["durationMs"] / 1000))
    return entry


def _run_started(event, data, users):
    entry = Entry(event, f"Run started ({data.get('trigger', '?')})", "run")
    if data.get("attempt"):
        entry.meta.append(f"attempt {data['attempt']}")
    return entry


def _run_finished(event, data, users):
    status = data.get("status", "")
    entry = Entry(
        event,
        "Run finished",
        "run",
        status=status,
        status_label=_label(RunStatus, status),
        text=data.get("error", ""),
    )
    if data.get("usage"):
        entry.meta.append(usage_text(data["usage"]))
    return entry


def _unknown(event, data, users):
    return Entry(event, event.type, "other", detail=data)


_RENDERERS = {
    "message.user": _user_message,
    "message.assistant": _assistant_message,
    "tool.call": _tool_call,
    "tool.result": _tool_result,
    "action.requested": _action_requested,
    "action.resolved": _action_resolved,
    "task.status": _task_status,
    "task.progress": _progress,
    "task.notification": _notification,
    "callback.delivered": _callback,
    "callback.failed": _callback,
    "run.started": _run_started,
    "run.finished": _run_finished,
}
