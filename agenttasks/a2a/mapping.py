"""agenttasks ⇄ A2A 1.0, built with the a2a-sdk's protobuf types (docs/a2a.md#mapping).

- statuses: pending → SUBMITTED, running → WORKING, waiting_for_input → INPUT_REQUIRED (the
  pending actions in the status message, as a data part a client answers), completed →
  COMPLETED, failed → FAILED, cancelled → CANCELED; a task refused at creation is REJECTED;
- the result is an artifact (a text part, and a file part for each result file);
- the conversation's messages are `history`, those of the earlier tasks of the context first;
- `contextId` is the A2A context a task was created in, or its conversation id.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber
from django.utils import timezone
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct, Value

from .. import lifecycle
from ..api.serializers import pending_actions
from ..ids import new_task_id
from ..models import A2AContext, Event, Task, TaskResult
from ..states import TaskStatus
from ..store import files
from ..toolkit import errors
from ..toolkit.checks import uploads as rest_uploads

STATES: dict[str, Any] = {
    TaskStatus.PENDING: pb.TASK_STATE_SUBMITTED,
    TaskStatus.RUNNING: pb.TASK_STATE_WORKING,
    TaskStatus.WAITING_FOR_INPUT: pb.TASK_STATE_INPUT_REQUIRED,
    TaskStatus.COMPLETED: pb.TASK_STATE_COMPLETED,
    TaskStatus.FAILED: pb.TASK_STATE_FAILED,
    TaskStatus.CANCELLED: pb.TASK_STATE_CANCELED,
}
# ListTasks' status filter, back to the statuses it means.
STATUSES_OF: dict[Any, list[str]] = {}
for _status, _state in STATES.items():
    STATUSES_OF.setdefault(_state, []).append(_status)
ROLES = {"message.user": pb.ROLE_USER, "message.assistant": pb.ROLE_AGENT}
ACTIONS_KEY = "pendingActions"


def state_of(status: str) -> Any:
    return STATES[TaskStatus(status)]


def value(data) -> Value:
    """Return a JSON value as a protobuf Value."""
    return json_format.ParseDict(data, Value())


def struct(data: dict) -> Struct:
    out = Struct()
    out.update(data)
    return out


def text_part(text: str) -> pb.Part:
    return pb.Part(text=text)


def file_part(ref: dict, base_url: str | None) -> pb.Part | None:
    """Return a stored file as a part that points to its content (the same auth as REST reads it)."""
    if not base_url or not isinstance(ref, dict) or not ref.get("id"):
        return None
    return pb.Part(
        url=f"{base_url}/files/{ref['id']}/content",
        filename=ref.get("name") or "",
        media_type=ref.get("mimeType") or "",
    )


# --- contexts ----------------------------------------------------------------------------------


def contexts_of(tasks) -> dict[str, str]:
    """Return the contextId of each task (its A2A context, or its own conversation id)."""
    tasks = list(tasks)
    linked = dict(
        A2AContext.objects.filter(task_id__in=[t.id for t in tasks]).values_list(
            "task_id", "context_id"
        )
    )
    return {t.id: linked.get(t.id, t.conversation_id) for t in tasks}


# --- reading a task ----------------------------------------------------------------------------


def latest_reply(task: Task) -> str:
    event = (
        Event.objects.filter(
            conversation_id=task.conversation_id, type="message.assistant", run_id=task.run_id
        )
        .exclude(data__content=None)
        .order_by("-seq")
        .first()
    )
    return ((event.data or {}).get("content") or "") if event is not None else ""


def action_text(action: dict) -> str:
    if action.get("kind") == "question":
        return "\n".join(q.get("question", "") for q in action.get("questions") or [])
    return action.get("prompt") or f"Approve {action.get('toolName', 'this action')}?"


def status_message(task: Task, context_id: str) -> pb.Message | None:
    """Return what the status says in words: the question asked, the error, the progress."""
    parts = []
    if task.status == TaskStatus.WAITING_FOR_INPUT:
        actions = pending_actions(task.conversation_id, run_id=task.run_id)
        if actions:
            parts.append(text_part("\n".join(action_text(a) for a in actions)))
            parts.append(pb.Part(data=value({ACTIONS_KEY: actions})))
        else:  # a legacy clarification: the agent's reply is the question
            parts.append(text_part(latest_reply(task) or "The agent needs more input."))
    elif task.status == TaskStatus.FAILED and task.error:
        parts.append(text_part(task.error))
    elif task.status in (TaskStatus.PENDING, TaskStatus.RUNNING):
        progress = lifecycle.progress_line(task)
        if progress:
            parts.append(text_part(progress))
    if not parts:
        return None
    return pb.Message(
        message_id=f"{task.id}-v{task.version}",
        context_id=context_id,
        task_id=task.id,
        role=pb.ROLE_AGENT,
        parts=parts,
    )


def status(task: Task, context_id: str) -> pb.TaskStatus:
    out = pb.TaskStatus(state=state_of(task.status))
    message = status_message(task, context_id)
    if message is not None:
        out.message.CopyFrom(message)
    out.timestamp.FromDatetime(task.updated_at or timezone.now())
    return out


def artifacts(task: Task, base_url: str | None) -> list[pb.Artifact]:
    """Return the task's result as an artifact: its text, and its files."""
    result = TaskResult.objects.filter(task_id=task.id).first()
    if result is None:
        return []
    parts = [text_part(result.content or "")]
    parts.extend(p for p in (file_part(f, base_url) for f in result.files or []) if p)
    return [
        pb.Artifact(
            artifact_id=result.id,
            name="result",
            parts=parts,
            metadata=struct({"runId": result.run_id, "partial": result.partial}),
        )
    ]


def reached(task: Task, context_id: str, length: int | None) -> list[tuple[str, str]]:
    """List the (conversation id, task id) of the last `length` tasks of a task's context up to
    it, of its owner, oldest first (None: all)."""
    # Each task has at least its input as a message: `length` messages reach no further back.
    earlier = Q(created_at__lt=task.created_at) | Q(created_at=task.created_at, id__lt=task.id)
    rows = (
        Task.objects.visible()
        .owned_by(task.owner_id)
        .filter(earlier, a2a_context__context_id=context_id)
        .order_by("-created_at", "-id")
        .values_list("conversation_id", "id")
    )
    if length is not None:
        rows = rows[: length - 1]
    return [*reversed(rows), (task.conversation_id, task.id)]


def last_messages(conversation_ids, length: int | None) -> dict[str, list[Event]]:
    """Read the messages of these conversations by seq, the last `length` of each (None: all)."""
    rows = Event.objects.filter(conversation_id__in=conversation_ids, type__in=list(ROLES)).exclude(
        type="message.assistant", data__content=None
    )
    if length is not None:
        latest = Window(RowNumber(), partition_by=F("conversation_id"), order_by=F("seq").desc())
        rows = rows.annotate(latest=latest).filter(latest__lte=length)
    out: dict[str, list[Event]] = {}
    for event in rows.order_by("conversation_id", "seq"):
        out.setdefault(event.conversation_id, []).append(event)
    return out


def histories(
    tasks: list[Task], contexts: dict[str, str], base_url: str | None, length: int | None
) -> dict[str, list[pb.Message]]:
    """Build each task's history: the last `length` messages (None: all) of its context's tasks
    up to it, reading only those (at most a statement per task, and one for their messages)."""
    if length == 0:
        return {t.id: [] for t in tasks}
    chains = {t.id: reached(t, contexts[t.id], length) for t in tasks}
    events = last_messages({c for chain in chains.values() for c, _ in chain}, length)
    out = {}
    for task in tasks:
        messages = [(t, e) for c, t in chains[task.id] for e in events.get(c, [])]
        if length is not None:
            messages = messages[-length:]
        out[task.id] = [history_message(e, t, contexts[task.id], base_url) for t, e in messages]
    return out


def history_message(event: Event, task_id: str, context_id: str, base_url) -> pb.Message:
    """Build a history message from a message event."""
    data = event.data or {}
    parts = [text_part(data.get("content") or "")]
    parts.extend(p for p in (file_part(f, base_url) for f in data.get("files") or []) if p)
    return pb.Message(
        message_id=event.id,
        context_id=context_id,
        task_id=task_id,
        role=ROLES[event.type],
        parts=parts,
    )


def task_message(
    task: Task,
    context_id: str,
    *,
    base_url: str | None,
    history: list[pb.Message],
    with_artifacts: bool = True,
) -> pb.Task:
    """Return an agenttasks task as an A2A Task, with its history (`histories`)."""
    meta: dict[str, Any] = {"agentId": task.agent, "conversationId": task.conversation_id}
    meta["runId"] = task.run_id
    meta["attempt"] = task.attempt_no()
    if task.label:
        meta["label"] = task.label
    out = pb.Task(
        id=task.id,
        context_id=context_id,
        status=status(task, context_id),
        history=history,
        metadata=struct(meta),
    )
    if with_artifacts:
        out.artifacts.extend(artifacts(task, base_url))
    return out


def rejected(reason: str, context_id: str, message: pb.Message) -> pb.Task:
    """Return a task refused at creation (nothing was written): REJECTED, with the reason."""
    task_id = new_task_id()
    out = pb.Task(id=task_id, context_id=context_id)
    out.status.state = pb.TASK_STATE_REJECTED
    out.status.message.CopyFrom(
        pb.Message(
            message_id=f"{task_id}-rejected",
            context_id=context_id,
            task_id=task_id,
            role=pb.ROLE_AGENT,
            parts=[text_part(reason)],
        )
    )
    out.status.timestamp.FromDatetime(timezone.now())
    out.history.append(message)
    return out


# --- reading a message -------------------------------------------------------------------------


@dataclass
class Incoming:
    """A message's parts as agenttasks takes them."""

    text: str = ""
    uploads: list = field(default_factory=list)
    data: list = field(default_factory=list)


def read(message: pb.Message, sent: list) -> Incoming:
    """Text parts are the input, raw file parts become task files, data parts are kept apart.

    The data and the file bytes are read from `sent`, the parts as their JSON came: protobuf
    holds a JSON number as a double (10**309 overflows it, 2**63 loses digits) and decodes base64
    leniently, where REST keeps the number and refuses the base64. A file part by URL is refused:
    the server does not fetch what a client points to.
    """
    out = Incoming()
    texts = []
    for i, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "raw":
            out.uploads.append(upload(i, part, sent[i]["raw"]))
        elif kind == "url":
            raise ContentTypeNotSupportedError(
                f"parts[{i}]: file parts by URL are not supported; send the bytes (raw)"
            )
        elif kind == "data":
            out.data.append(sent[i]["data"])
    out.text = "\n\n".join(t for t in texts if t)
    return out


# REST's FileInput fields (docs/rest.md#files), as a file part names them.
PART_FIELDS = {"name": "filename", "mimeType": "mediaType", "content": "raw"}


def upload(i: int, part: pb.Part, raw: str) -> files.Upload:
    """Check a file part with REST's check of an upload (name, media type, strict base64)."""
    item = {
        "name": files.clean_name(part.filename) or f"file-{i + 1}",
        "mimeType": part.media_type or "application/octet-stream",
        "content": raw,
    }
    try:
        (checked,) = rest_uploads([item])
    except errors.ApiError as exc:
        message = exc.message
        for rest_field, field_name in PART_FIELDS.items():
            message = message.replace(f"files[0].{rest_field}", f"parts[{i}].{field_name}")
        raise InvalidParamsError(message) from None
    checked.index = i
    return checked


def without_values(params: dict) -> dict:
    """Drop from SendMessageRequest params the JSON values the service reads as sent."""
    # The request's and the message's metadata and the data parts: protobuf holds their numbers
    # as doubles, and one a double cannot hold (10**309) stops it reading the rest.
    out = {k: v for k, v in params.items() if k != "metadata"}
    message = params.get("message")
    if isinstance(message, dict):
        out["message"] = {k: v for k, v in message.items() if k != "metadata"}
        parts = message.get("parts")
        if isinstance(parts, list):
            # {} keeps the part a data part (and one with another content still refused).
            out["message"]["parts"] = [
                {**p, "data": {}} if isinstance(p, dict) and "data" in p else p for p in parts
            ]
    return out


def input_text(incoming: Incoming) -> str:
    """Return a new task's input: the text, and any data parts as JSON after it."""
    chunks = [incoming.text] if incoming.text else []
    chunks += [json.dumps(d, ensure_ascii=False, separators=(",", ":")) for d in incoming.data]
    return "\n\n".join(chunks)
