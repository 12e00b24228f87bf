"""Routes of the REST API: canonical paths, with or without one trailing slash, never redirected.

`urlpatterns` dispatch (each route also matches its path plus "/"); `schema_patterns` are the
same routes in their canonical form, for the OpenAPI document. `agenttasks.urls` mounts them
beside the other surfaces.
"""

import re

from django.urls import path, re_path

from . import ops, schema, views

ROUTES = [
    ("", schema.IndexView, "index"),
    ("tasks", views.TaskListView, "tasks"),
    ("tasks/<taskId>", views.TaskView, "task"),
    ("tasks/<taskId>/status", views.TaskStatusView, "task-status"),
    ("tasks/<taskId>/wait", views.TaskWaitView, "task-wait"),
    ("tasks/<taskId>/result", views.TaskResultView, "task-result"),
    ("tasks/<taskId>/runs", views.TaskRunsView, "task-runs"),
    ("tasks/<taskId>/comments", views.TaskCommentsView, "task-comments"),
    ("tasks/<taskId>/cancel", views.TaskCancelView, "task-cancel"),
    ("tasks/<taskId>/retry", views.TaskRetryView, "task-retry"),
    ("conversations", views.ConversationListView, "conversations"),
    ("conversations/<conversationId>", views.ConversationView, "conversation"),
    ("conversations/<conversationId>/messages", views.MessagesView, "messages"),
    ("conversations/<conversationId>/events", views.EventsView, "events"),
    ("conversations/<conversationId>/events/stream", views.EventStreamView, "events-stream"),
    ("conversations/<conversationId>/actions", views.ActionsView, "actions"),
    ("conversations/<conversationId>/actions/<actionId>", views.ActionView, "action"),
    (
        "conversations/<conversationId>/runs/<runId>/cancel",
        views.WaitingRunCancelView,
        "waiting-run-cancel",
    ),
    ("schedules", views.ScheduleListView, "schedules"),
    ("schedules/<scheduleId>", views.ScheduleView, "schedule"),
    ("schedules/<scheduleId>/pause", views.SchedulePauseView, "schedule-pause"),
    ("schedules/<scheduleId>/resume", views.ScheduleResumeView, "schedule-resume"),
    ("schedules/<scheduleId>/run", views.ScheduleRunView, "schedule-run"),
    ("files/<fileId>", views.FileView, "file"),
    ("files/<fileId>/content", views.FileContentView, "file-content"),
    ("agents", views.AgentListView, "agents"),
    ("agents/<agentId>", views.AgentView, "agent"),
    ("docs", schema.SwaggerView, "docs"),
    ("docs/openapi.json", schema.OpenApiView, "openapi"),
]


def _regex(route: str) -> str:
    parts = re.split(r"<(\w+)>", route)
    # Even parts are literal text, odd parts are parameter names (any text but a slash).
    return "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))


urlpatterns = [
    # The mount point itself is the index ("^/?$" would start with a slash: urls.W002).
    *(
        re_path(rf"^{_regex(r)}/?$" if r else "^$", view.as_view(), name=name)
        for r, view, name in ROUTES
    ),
    re_path(r"^docs/assets/(?P<name>[^/]+)/?$", schema.AssetView.as_view(), name="docs-asset"),
    # Operating endpoints (api/ops.py): plain views for load balancers and Prometheus.
    re_path(r"^health/?$", ops.health, name="health"),
    re_path(r"^metrics/?$", ops.metrics, name="metrics"),
]

schema_patterns = [
    path(re.sub(r"<(\w+)>", r"<str:\1>", r), view.as_view()) for r, view, _ in ROUTES
]
