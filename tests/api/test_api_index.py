"""`GET /` under the mount point (the demo's /api/agents/): an index of the API."""

import pytest
from django.test import Client

from .conftest import PREFIX, agenttasks, error

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_index_lists_endpoints_docs_and_agents(as_alice):
    response = as_alice.get(PREFIX + "/")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    index = response.json()
    assert index["name"] == "agenttasks"
    assert (index["docs"], index["openapi"]) == (PREFIX + "/docs", PREFIX + "/docs/openapi.json")
    endpoints = {(e["method"], e["path"]): e for e in index["endpoints"]}
    assert endpoints[("POST", PREFIX + "/tasks")]["summary"] == "Create a task"
    assert ("GET", PREFIX + "/conversations/{conversationId}/events/stream") in endpoints
    assert ("GET", PREFIX + "/") in endpoints
    assert index["agents"] == as_alice.get("/agents").json()["agents"]
    assert "internal" not in {a["id"] for a in index["agents"]}  # not exposed over REST


def test_the_index_lists_health_metrics_and_a2a(anonymous):
    index = anonymous.get(PREFIX + "/").json()
    assert index["health"] == PREFIX + "/health" and "metrics" not in index
    assert index["a2a"] == {
        "agentCard": PREFIX + "/a2a/{agentId}/.well-known/agent-card.json",
        "jsonRpc": PREFIX + "/a2a/{agentId}",
        "httpJson": PREFIX + "/a2a/{agentId}/rest",
    }
    assert Client().get(index["health"]).status_code in (200, 503)
    card = index["a2a"]["agentCard"].replace("{agentId}", "echo")
    assert Client().get(card).status_code == 200
    with agenttasks(METRICS_ENABLED=True):
        index = anonymous.get(PREFIX + "/").json()
        assert Client().get(index["metrics"]).status_code == 200


def test_the_index_needs_no_user_but_shows_agents_only_to_one(anonymous):
    index = anonymous.get(PREFIX + "/").json()
    assert "agents" not in index and index["docs"] == PREFIX + "/docs"
    with agenttasks(ALLOW_ANONYMOUS=True):
        assert anonymous.get(PREFIX + "/").json()["agents"]
    with agenttasks(SERVE_DOCS=False):
        index = anonymous.get(PREFIX + "/").json()
        assert "docs" not in index and "openapi" not in index and index["endpoints"]
    bad = Client().get(PREFIX + "/", HTTP_AUTHORIZATION="Token nope")
    error(bad, 401, "identity_required", "Invalid token.")


def test_the_home_page_link_works(anonymous):
    home = Client().get("/")
    assert b'href="/api/agents/docs"' in home.content  # the Swagger UI, not raw JSON
    assert Client().get("/api/agents/docs").status_code == 200
