"""Session authentication with CSRF enforced: a browser that logged into the admin writes.

The client holds the `csrftoken` cookie as a browser does after logging in, so every write goes
through Django's whole CSRF check (which reads the request's POST data before the view runs).
"""

import json

import pytest
from django.test import Client

from agenttasks.models import Comment, Task

from .conftest import PREFIX, error, settled

pytestmark = pytest.mark.django_db(transaction=True)


class Browser:
    """A Django test client that logged in through the admin's form, with CSRF enforced."""

    def __init__(self, username: str, password: str):
        self.client = Client(enforce_csrf_checks=True)
        self.client.get("/admin/login/")
        response = self.client.post(
            "/admin/login/",
            {
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": self.token,
                "next": "/admin/",
            },
        )
        assert response.status_code == 302, response.content

    @property
    def token(self) -> str:
        return self.client.cookies["csrftoken"].value

    def post(self, path: str, body=None, *, token: str | None = "cookie"):
        headers = {}
        if token is not None:
            headers["HTTP_X_CSRFTOKEN"] = self.token if token == "cookie" else token
        return self.client.post(
            PREFIX + path,
            data=json.dumps(body if body is not None else {}),
            content_type="application/json",
            **headers,
        )

    def get(self, path: str):
        return self.client.get(PREFIX + path)


@pytest.fixture
def browser(alice):
    alice.is_staff = True  # she logs in through the admin's form
    alice.set_password("alice-password")
    alice.save()
    return Browser("alice", "alice-password")


def test_a_logged_in_browser_writes_with_its_token(browser, workers, gates):
    created = browser.post("/tasks", {"agentId": "echo", "input": "hello"})
    assert created.status_code == 201, created.content
    task = created.json()["task"]
    settled(task["id"], "completed")

    comment = browser.post(f"/tasks/{task['id']}/comments", {"content": "again"})
    assert comment.status_code == 201, comment.content
    settled(task["id"], "completed")

    meta = gates.new()
    held = browser.post("/tasks", {"agentId": "gate", "input": "hold", "metadata": meta})
    held = held.json()["task"]
    cancel = browser.post(f"/tasks/{held['id']}/cancel", {})
    assert cancel.status_code == 200, cancel.content
    assert cancel.json()["task"]["status"] == "cancelled"

    boom = browser.post("/tasks", {"agentId": "boom", "input": "go"}).json()["task"]
    settled(boom["id"], "failed")
    retry = browser.post(f"/tasks/{boom['id']}/retry")
    assert retry.status_code == 202, retry.content

    asked = browser.post("/tasks", {"agentId": "approver", "input": "prod"}).json()["task"]
    settled(asked["id"], "waiting_for_input")
    action = browser.get(f"/tasks/{asked['id']}").json()["pendingActions"][0]
    answer = browser.post(
        f"/conversations/{asked['conversationId']}/actions/{action['id']}", {"approved": True}
    )
    assert answer.status_code == 200, answer.content
    settled(asked["id"], "completed")


@pytest.mark.parametrize(
    "token, reason",
    [
        (None, "CSRF token missing."),
        ("x" * 32, "CSRF token from the 'X-Csrftoken' HTTP header incorrect."),
    ],
    ids=["missing", "wrong"],
)
def test_a_missing_or_wrong_token_is_forbidden(browser, token, reason):
    assert browser.get("/tasks").status_code == 200  # the session is alice
    response = browser.post("/tasks", {"agentId": "echo", "input": "x"}, token=token)
    found = error(response, 403, "FORBIDDEN")
    assert found["message"] == f"CSRF Failed: {reason}"
    assert Task.objects.count() == 0 and Comment.objects.count() == 0


READ_ONLY_VIEWS = [
    ("post", f"{PREFIX}/health"),
    ("delete", f"{PREFIX}/health"),
    ("post", f"{PREFIX}/metrics"),
    ("delete", f"{PREFIX}/metrics"),
    ("post", f"{PREFIX}/a2a/echo/.well-known/agent-card.json"),
    ("put", f"{PREFIX}/a2a/echo/.well-known/agent-card.json"),
]


@pytest.mark.parametrize("signed_in", [False, True])
@pytest.mark.parametrize("method,path", READ_ONLY_VIEWS)
def test_a_write_method_on_a_read_only_view_is_a_json_405_under_csrf(
    alice, method, path, signed_in, settings
):
    # Django's test client skips CSRF checks unless told: with them, the middleware answered an
    # HTML 403 before these views could answer 405.
    settings.AGENTTASKS = {**settings.AGENTTASKS, "METRICS_ENABLED": True}
    client = Client(enforce_csrf_checks=True)
    if signed_in:
        alice.is_staff = True  # she logs in through the admin's form
        alice.set_password("alice-password")
        alice.save()
        client = Browser("alice", "alice-password").client
    response = getattr(client, method)(path, "{}", content_type="application/json")
    assert response.status_code == 405, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] in ("METHOD_NOT_ALLOWED", 405)
