"""The MCP endpoint, under the app's mount point (docs/mcp.md#endpoint)."""

from django.urls import re_path

from ..toolkit import lazy

# The view, and MCP's wire types with it, load with the first MCP request.
urlpatterns = [re_path(r"^mcp/?$", lazy.view("agenttasks.mcp.views", "McpView"), name="mcp")]
