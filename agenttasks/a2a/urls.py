"""Routes of the A2A servers, under the app's mount point (docs/a2a.md#endpoints)."""

from django.urls import re_path

from .views import AgentCardView, JsonRpcView, RestView

AGENT = r"^a2a/(?P<agentId>[^/]+)"
TASK = r"/rest/tasks/(?P<taskId>[^/:]+)"

urlpatterns = [
    re_path(AGENT + r"/\.well-known/agent-card\.json$", AgentCardView.as_view(), name="a2a-card"),
    re_path(AGENT + r"/?$", JsonRpcView.as_view(), name="a2a-jsonrpc"),
    re_path(AGENT + r"/rest/message:send$", RestView.as_view(op="send"), name="a2a-send"),
    re_path(AGENT + r"/rest/message:stream$", RestView.as_view(op="stream"), name="a2a-stream"),
    re_path(AGENT + r"/rest/tasks/?$", RestView.as_view(op="tasks"), name="a2a-tasks"),
    re_path(AGENT + TASK + "$", RestView.as_view(op="task"), name="a2a-task"),
    re_path(AGENT + TASK + ":cancel$", RestView.as_view(op="cancel"), name="a2a-cancel"),
    re_path(AGENT + TASK + ":subscribe$", RestView.as_view(op="subscribe"), name="a2a-subscribe"),
    re_path(
        AGENT + TASK + "/pushNotificationConfigs/?$",
        RestView.as_view(op="configs"),
        name="a2a-push-configs",
    ),
    re_path(
        AGENT + TASK + "/pushNotificationConfigs/(?P<configId>[^/]+)$",
        RestView.as_view(op="config"),
        name="a2a-push-config",
    ),
    re_path(
        AGENT + r"/rest/extendedAgentCard$",
        RestView.as_view(op="extendedAgentCard"),
        name="a2a-extended-card",
    ),
]
