"""URLs of the agenttasks REST API: `path("api/agents/", include("agenttasks.urls"))`."""

from .api.urls import urlpatterns

app_name = "agenttasks"

__all__ = ["app_name", "urlpatterns"]
