"""A task created with `notBefore` waits for its time; `priority` orders the claims
(docs/rest.md#creating-a-task)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agenttasks import store
from agenttasks.models import Conversation, Run, Task
from agenttasks.text import iso

from ..conftest import wait_for
from .conftest import error

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_start_in_the_future_waits_and_says_when(as_alice):
    later = timezone.now().replace(microsecond=0) + timedelta(minutes=10)
    response = as_alice.post(
        "/tasks", {"agentId": "echo", "input": "later", "notBefore": iso(later), "priority": 7}
    )
    assert response.status_code == 201
    task = response.json()["task"]
    assert (task["status"], task["notBefore"], task["priority"]) == ("pending", iso(later), 7)
    assert as_alice.get(f"/tasks/{task['id']}").json()["task"]["notBefore"] == iso(later)
    assert store.claim_many("host:1", 10).runs == []  # not due: no claim takes it
    assert Run.objects.get(pk=task["runId"]).not_before == later


def test_a_start_in_the_past_starts_now(as_alice, workers):
    past = iso(timezone.now() - timedelta(hours=1))
    task = as_alice.post("/tasks", {"agentId": "echo", "input": "now", "notBefore": past}).json()
    assert "notBefore" not in task["task"] and task["task"]["priority"] == 0
    wait_for(
        lambda: Task.objects.get(pk=task["task"]["id"]).status == "completed",
        message="the task to complete",
    )


@pytest.mark.parametrize(
    "body, field, message",
    [
        ({"notBefore": "tomorrow"}, "notBefore", "notBefore must be an ISO 8601 date and time"),
        ({"notBefore": "2026-12-05T09:00:00"}, "notBefore", "with an offset"),
        ({"notBefore": 1764924000}, "notBefore", "notBefore must be an ISO 8601"),
        ({"priority": 101}, "priority", "priority must be an integer from -100 to 100"),
        ({"priority": "high"}, "priority", "priority must be an integer from -100 to 100"),
        ({"priority": True}, "priority", "priority must be an integer from -100 to 100"),
    ],
)
def test_a_bad_start_or_priority_is_a_clear_400_and_writes_nothing(as_alice, body, field, message):
    response = as_alice.post("/tasks", {"agentId": "echo", "input": "x", **body})
    found = error(response, 400, "VALIDATION_ERROR")
    assert message in found["message"] and field in found["details"]["fields"]
    assert not Task.objects.exists() and not Conversation.objects.exists()


def test_a_waiting_task_can_be_cancelled_and_deleted(as_alice):
    later = iso(timezone.now() + timedelta(hours=1))
    body = {"agentId": "echo", "input": "later", "notBefore": later}
    first = as_alice.post("/tasks", body).json()["task"]
    cancelled = as_alice.post(f"/tasks/{first['id']}/cancel").json()["task"]
    assert cancelled["status"] == "cancelled" and "notBefore" not in cancelled
    second = as_alice.post("/tasks", body).json()["task"]
    assert as_alice.delete(f"/conversations/{second['conversationId']}").status_code == 204
    assert not Task.objects.filter(pk=second["id"]).exists()
