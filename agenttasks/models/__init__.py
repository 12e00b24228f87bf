"""The data model: conversations and their event log, tasks, runs, actions, wake-ups, files."""

from .action import PendingAction
from .conversation import RESERVED_METADATA, Conversation, Event
from .file import File
from .ops import Counter, ReaperPass
from .run import Run
from .slot import Slot
from .task import Comment, Task, TaskResult
from .wakeup import Wakeup

__all__ = [
    "RESERVED_METADATA",
    "Comment",
    "Counter",
    "Conversation",
    "Event",
    "File",
    "PendingAction",
    "ReaperPass",
    "Run",
    "Slot",
    "Task",
    "TaskResult",
    "Wakeup",
]
