"""The MCP endpoint, under the app's mount point (docs/mcp.md#endpoint)."""

from django.urls import re_path

from .views import McpView

urlpatterns = [re_path(r"^mcp/?$", McpView.as_view(), name="mcp")]
