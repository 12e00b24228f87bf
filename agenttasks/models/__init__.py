"""The data model: conversations and their event log, tasks, runs, actions, wake-ups, files,
schedules."""

from .a2a import A2AContext, A2APushConfig
from .action import PendingAction
from .conversation import RESERVED_METADATA, Conversation, Event
from .delivery import Delivery
from .file import File
from .idempotency import IdempotencyKey
from .limits import ProviderBudget, ProviderPermit
from .ops import Counter, ListenedChannel, ReaperPass, TaskCount, WorkerProcess
from .run import Run
from .schedule import Schedule, ScheduleTick
from .slot import Slot
from .task import Comment, Task, TaskResult
from .wakeup import Wakeup

__all__ = [
    "A2AContext",
    "A2APushConfig",
    "RESERVED_METADATA",
    "Comment",
    "Counter",
    "Conversation",
    "Delivery",
    "Event",
    "File",
    "IdempotencyKey",
    "ListenedChannel",
    "PendingAction",
    "ProviderBudget",
    "ProviderPermit",
    "ReaperPass",
    "Run",
    "Schedule",
    "ScheduleTick",
    "Slot",
    "Task",
    "TaskCount",
    "TaskResult",
    "Wakeup",
    "WorkerProcess",
]
