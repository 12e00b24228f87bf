"""Every surface under one mount point: `path("api/agents/", include("agenttasks.urls"))`.

REST (docs/rest.md) with the operating endpoints, A2A (docs/a2a.md) and MCP (docs/mcp.md) when
their extras are installed, and a catch-all that answers any other path in REST's error envelope.
"""

from django.http import HttpResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt

from .a2a import available as a2a_available
from .api import urls as rest
from .langgraph.urls import urlpatterns as langgraph_patterns
from .mcp import available as mcp_available
from .toolkit import errors

app_name = "agenttasks"


@csrf_exempt
def route_not_found(request, *args, **kwargs) -> HttpResponse:
    """Answer any other path under the mount point (whoever asks: it reveals nothing)."""
    return errors.json_error(errors.route_not_found(request))


urlpatterns = list(rest.urlpatterns) + langgraph_patterns  # LangGraph's API (docs/langgraph.md)
if a2a_available():  # the A2A servers, with the `a2a` extra installed
    from .a2a.urls import urlpatterns as a2a_patterns

    urlpatterns += a2a_patterns
if mcp_available():  # the MCP endpoint, with the `mcp` extra installed
    from .mcp.urls import urlpatterns as mcp_patterns

    urlpatterns += mcp_patterns
urlpatterns.append(re_path(r"^", route_not_found, name="route-not-found"))

# The REST routes in their canonical form: the OpenAPI document of the mounted API
# (agenttasks.api.schema.mounted_patterns) reads them from here.
schema_patterns = rest.schema_patterns
