"""The REST views (docs/rest.md): thin DRF views that validate, check, and call the lifecycle.

Every view answers in the app's own terms whatever the host configured: its authentication
(AGENTTASKS["AUTHENTICATION_CLASSES"] or DRF's default), its permission rule, its throttles, its
body reading, its JSON renderer and its error envelope. Checks run in the global order of docs/rest.md#errors:
identity, throttle, body syntax, the path's resources (404, then 403, outermost first), body and
query validation, the endpoint's own checks, then state conflicts. A rejected request writes
nothing.
"""

from ...toolkit.policies import AppPolicies, FirstRenderer
from .actions import ActionsView, ActionView
from .agents import AgentListView, AgentView
from .base import ApiView, extend_schema
from .conversations import (
    ConversationListView,
    ConversationView,
    MessagesView,
    WaitingRunCancelView,
)
from .events import EventStreamView, EventsView
from .files import FileContentView, FileView
from .schedules import (
    ScheduleListView,
    SchedulePauseView,
    ScheduleResumeView,
    ScheduleRunView,
    ScheduleView,
)
from .tasks import (
    TaskCancelView,
    TaskCommentsView,
    TaskListView,
    TaskResultView,
    TaskRetryView,
    TaskRunsView,
    TaskStatusView,
    TaskView,
    TaskWaitView,
)

__all__ = [
    "ScheduleListView",
    "SchedulePauseView",
    "ScheduleResumeView",
    "ScheduleRunView",
    "ScheduleView",
    "ActionView",
    "ActionsView",
    "AgentListView",
    "AgentView",
    "ApiView",
    "AppPolicies",
    "ConversationListView",
    "ConversationView",
    "EventStreamView",
    "EventsView",
    "FileContentView",
    "FileView",
    "FirstRenderer",
    "MessagesView",
    "WaitingRunCancelView",
    "TaskCancelView",
    "TaskCommentsView",
    "TaskListView",
    "TaskResultView",
    "TaskRetryView",
    "TaskRunsView",
    "TaskStatusView",
    "TaskView",
    "TaskWaitView",
    "extend_schema",
]
