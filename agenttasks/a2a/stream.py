"""SendStreamingMessage and SubscribeToTask: a task's updates as Server-Sent Events.

The first event is the Task; then the task's own events in its conversation's log become
`TaskStatusUpdateEvent`s (`task.status`, and `task.progress` as WORKING with the progress) and,
at a completed or failed ending, a `TaskArtifactUpdateEvent` with the result before the final
status. The stream closes after a terminal or input-required status. The REST events stream's
drivers (api/streams.py) run it: they read the log by `seq`, wake on the in-process hub (fed by
PostgreSQL NOTIFY too) and poll, hold one of the user's MAX_STREAMS_PER_USER places, send
keep-alives and end after STREAM_MAX_SECONDS, from a generator under WSGI or an async one under
ASGI.
"""

import logging

from a2a.types import a2a_pb2 as pb
from google.protobuf import json_format

from ..models import Conversation, Event, Task
from ..states import TERMINAL, TaskStatus
from ..toolkit.streams import Follower
from . import mapping

logger = logging.getLogger(__name__)

ENDS = TERMINAL | {TaskStatus.WAITING_FOR_INPUT}


class TaskFollower(Follower):
    """What one stream has sent of one task, and how to read what comes next.

    It follows the task's conversation for an toolkit.streams driver; `frame(dict)` and
    `error_frame(exc)` write a StreamResponse and an error in the request's binding.
    """

    def __init__(
        self, call, task_id: str, frame, error_frame, held=None, client_fd=None, sent=None
    ):
        super().__init__(held, client_fd)
        self.call = call
        self.task_id = task_id
        self.frame, self.error_frame = frame, error_frame
        self.sent = sent  # SendStreamingMessage: the task as sent, and where its log resumes
        self.conversation_id = (
            Task.objects.filter(pk=task_id).values_list("conversation_id", flat=True).get()
        )
        self.context_id = ""

    def opening(self) -> list[str]:
        return [self.frame(self.first())]

    def first(self) -> dict:
        """Return the Task as it is now (or as the message left it); the log is followed from here."""
        if self.sent is not None:
            self.last = self.sent.after
            self.context_id = self.sent.message.context_id
            if self.sent.task.status in ENDS:
                self.done = True
            return self._dict(pb.StreamResponse(task=self.sent.message))
        # The resume point is read before the task, so the Task sent is at least that new.
        self.last = (
            Conversation.objects.filter(pk=self.conversation_id)
            .values_list("last_seq", flat=True)
            .first()
            or 0
        )
        task = Task.objects.select_related("run").get(pk=self.task_id)
        self.context_id = mapping.contexts_of([task])[task.id]
        if task.status in ENDS:
            self.done = True
        return self._dict(pb.StreamResponse(task=self.call.present(task)))

    def poll(self) -> str:
        """Return the frames of the task's events committed since the last read ("" when none).

        Like the REST stream, it ends once the conversation is being deleted: the rows it would
        read next are going, and so is the terminal update that would have ended it.
        """
        text = "".join(self.frame(update) for update in self._read())
        if not text and not self.done and self.deleted():
            self.done = True
        return text

    def _read(self) -> list[dict]:
        out = []
        for event in self.next_events():
            self.last = event.seq
            if event.task_id != self.task_id:
                continue  # a child's status mirrored into this conversation
            out.extend(self._updates(event))
            if self.done:
                break
        return out

    def _updates(self, event: Event) -> list[dict]:
        data = event.data or {}
        if event.type == "task.progress":
            status = pb.TaskStatus(state=pb.TASK_STATE_WORKING)
            status.message.CopyFrom(
                pb.Message(
                    message_id=event.id,
                    context_id=self.context_id,
                    task_id=self.task_id,
                    role=pb.ROLE_AGENT,
                    parts=[mapping.text_part(data.get("progress") or "")],
                )
            )
            status.timestamp.FromDatetime(event.created_at)
            meta = {"progress": data.get("progress") or "", "seq": event.seq}
            if data.get("state") is not None:
                meta["state"] = data["state"]
            return [self._status(status, meta)]
        if event.type != "task.status" or data.get("to") not in mapping.STATES:
            return []
        if "from" not in data:
            return []  # the creation: the first event (the Task) already says SUBMITTED
        to = data["to"]
        task = Task.objects.select_related("run").get(pk=self.task_id)
        out = []
        if to in (TaskStatus.COMPLETED, TaskStatus.FAILED):
            for artifact in mapping.artifacts(task, self.call.mount_url):
                update = pb.TaskArtifactUpdateEvent(
                    task_id=self.task_id,
                    context_id=self.context_id,
                    artifact=artifact,
                    last_chunk=True,
                )
                out.append(self._dict(pb.StreamResponse(artifact_update=update)))
        if task.status == to:
            status = mapping.status(task, self.context_id)
        else:  # the task has moved on since: the state this event recorded
            status = pb.TaskStatus(state=mapping.state_of(to))
            status.timestamp.FromDatetime(event.created_at)
        out.append(self._status(status, {"seq": event.seq}))
        if to in ENDS:
            self.done = True
        return out

    def _status(self, status: pb.TaskStatus, meta: dict) -> dict:
        update = pb.TaskStatusUpdateEvent(
            task_id=self.task_id, context_id=self.context_id, status=status
        )
        update.metadata.update(meta)
        return self._dict(pb.StreamResponse(status_update=update))

    @staticmethod
    def _dict(message) -> dict:
        return json_format.MessageToDict(message)

    def failed(self, exc: Exception) -> str:
        logger.error("a2a.stream_failed task=%s", self.task_id, exc_info=exc)
        return self.error_frame(exc)
