"""Routes of the A2A servers, under the app's mount point (docs/a2a.md#endpoints)."""

from django.urls import re_path

from ..toolkit import lazy

# The views, and the a2a-sdk with them, load with the first A2A request.
VIEWS = "agenttasks.a2a.views"

AGENT = r"^a2a/(?P<agentId>[^/]+)"
TASK = r"/rest/tasks/(?P<taskId>[^/:]+)"

urlpatterns = [
    re_path(
        AGENT + r"/\.well-known/agent-card\.json$",
        lazy.view(VIEWS, "AgentCardView"),
        name="a2a-card",
    ),
    re_path(AGENT + r"/?$", lazy.view(VIEWS, "JsonRpcView"), name="a2a-jsonrpc"),
    re_path(
        AGENT + r"/rest/message:send$", lazy.view(VIEWS, "RestView", op="send"), name="a2a-send"
    ),
    re_path(
        AGENT + r"/rest/message:stream$",
        lazy.view(VIEWS, "RestView", op="stream"),
        name="a2a-stream",
    ),
    re_path(AGENT + r"/rest/tasks/?$", lazy.view(VIEWS, "RestView", op="tasks"), name="a2a-tasks"),
    re_path(AGENT + TASK + "$", lazy.view(VIEWS, "RestView", op="task"), name="a2a-task"),
    re_path(
        AGENT + TASK + ":cancel$", lazy.view(VIEWS, "RestView", op="cancel"), name="a2a-cancel"
    ),
    re_path(
        AGENT + TASK + ":subscribe$",
        lazy.view(VIEWS, "RestView", op="subscribe"),
        name="a2a-subscribe",
    ),
    re_path(
        AGENT + TASK + "/pushNotificationConfigs/?$",
        lazy.view(VIEWS, "RestView", op="configs"),
        name="a2a-push-configs",
    ),
    re_path(
        AGENT + TASK + "/pushNotificationConfigs/(?P<configId>[^/]+)$",
        lazy.view(VIEWS, "RestView", op="config"),
        name="a2a-push-config",
    ),
    re_path(
        AGENT + r"/rest/extendedAgentCard$",
        lazy.view(VIEWS, "RestView", op="extendedAgentCard"),
        name="a2a-extended-card",
    ),
]
