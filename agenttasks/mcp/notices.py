"""The wake-up a 2025-11-25 session is owed, sent as a notification while the session listens.

The client's conversation has no agent behind it: when one of its tasks completes or fails, the
result it is owed (a pending wake-up) starts no run (docs/lifecycle.md#wake-up-debt-and-notifications).
A session that keeps its standalone stream open (GET on the endpoint; the stdio pipe) is told
at once, with the notification our own models would read, as a `notifications/message` (level
`notice`, logger `agenttasks`, data `{"text", "taskIds"}`). A notification may be lost, so it
settles nothing: the next `task_status` without a task_id hands the same results over and
settles them as the model's own pull.
"""

import logging

from ..delivery import wakeups
from ..models import Conversation
from ..runtime.base import release_connection
from ..states import TaskStatus
from ..toolkit.streams import Follower
from . import protocol

logger = logging.getLogger(__name__)

ENDINGS = {TaskStatus.COMPLETED, TaskStatus.FAILED}  # the endings that owe a wake-up


def message(items) -> dict:
    """Return the notifications/message telling a client what its tasks' endings owe it."""
    data = {"text": wakeups.format_notification(items), "taskIds": [w.task_id for w in items]}
    params = {"level": "notice", "logger": "agenttasks", "data": data}
    return protocol.notification("notifications/message", params)


class NoticeFollower(Follower):
    """Follow a session's conversation; send each owed result once (an toolkit.streams Follower)."""

    def __init__(self, session, frame, held=None, client_fd=None):
        super().__init__(held, client_fd)
        self.session = session
        self.conversation_id = session.conversation_id
        self.frame = frame
        self.sent: set[tuple[str, str]] = set()  # (task id, run id) of the wake-ups told

    def opening(self) -> list[str]:
        """Return what is owed now (a stream that reconnects is told again), then what comes."""
        self.last = (
            Conversation.objects.filter(pk=self.conversation_id)
            .values_list("last_seq", flat=True)
            .first()
            or 0
        )
        return [self._owed()]

    def poll(self) -> str:
        try:
            events = self.next_events(["task.status"])
            if events:
                self.last = events[-1].seq
            if any((e.data or {}).get("to") in ENDINGS for e in events):
                return self._owed()
            self.done = self.done or self.deleted()
            return ""
        finally:
            release_connection()

    def _owed(self) -> str:
        items = [
            w for w in wakeups.owed(self.conversation_id) if (w.task_id, w.run_id) not in self.sent
        ]
        if not items:
            return ""
        self.sent.update((w.task_id, w.run_id) for w in items)
        return self.frame(message(items))

    def failed(self, exc: Exception) -> str:
        logger.error("mcp.notices_failed conversation=%s", self.conversation_id, exc_info=exc)
        return ""
