"""Routes of LangGraph's Agent Server API under `<mount>/langgraph` (docs/langgraph.md#routes)."""

from django.urls import re_path

from . import views

ID = r"(?P<{}>[^/]+)"
THREAD = "threads/" + ID.format("thread_id")
RUN = THREAD + "/runs/" + ID.format("run_id")
ASSISTANT = "assistants/" + ID.format("assistant_id")


def route(pattern: str, view, name: str):
    return re_path(rf"^langgraph/{pattern}/?$", view.as_view(), name=f"langgraph-{name}")


urlpatterns = [
    # What has no equivalent here answers in LangGraph's error shape (docs/langgraph.md).
    route("store/.*", views.NotSupportedView, "store"),
    route("runs/crons", views.CronsView, "crons"),
    route("runs/crons/search", views.CronSearchView, "cron-search"),
    route("runs/crons/" + ID.format("cron_id"), views.CronView, "cron"),
    route(THREAD + "/runs/crons", views.CronsView, "thread-crons"),
    route("info", views.InfoView, "info"),
    route("assistants/search", views.AssistantSearchView, "assistant-search"),
    route(ASSISTANT + "/schemas", views.AssistantSchemasView, "assistant-schemas"),
    route(ASSISTANT + "/graph", views.AssistantGraphView, "assistant-graph"),
    route(ASSISTANT, views.AssistantView, "assistant"),
    route("threads", views.ThreadsView, "threads"),
    route("threads/search", views.ThreadSearchView, "thread-search"),
    route(THREAD + "/state", views.ThreadStateView, "thread-state"),
    route(THREAD + "/history", views.ThreadHistoryView, "thread-history"),
    route(THREAD + "/copy", views.ThreadCopyView, "thread-copy"),
    route(THREAD + "/runs", views.RunsView, "runs"),
    route(THREAD + "/runs/wait", views.RunWaitView, "runs-wait"),
    route(THREAD + "/runs/stream", views.RunStreamView, "runs-stream"),
    route(RUN + "/join", views.RunJoinView, "run-join"),
    route(RUN + "/stream", views.RunJoinStreamView, "run-stream"),
    route(RUN + "/cancel", views.RunCancelView, "run-cancel"),
    route(RUN, views.RunView, "run"),
    route(THREAD, views.ThreadView, "thread"),
    route("runs", views.RunsView, "stateless-runs"),
    route("runs/wait", views.RunWaitView, "stateless-wait"),
    route("runs/stream", views.RunStreamView, "stateless-stream"),
    route("store/.*", views.NotSupportedView, "store"),
    route("runs/crons(?:/.*)?", views.NotSupportedView, "crons"),
    route(
        "threads/" + ID.format("thread_id") + "/runs/crons", views.NotSupportedView, "thread-crons"
    ),
]
