"""docs/rest.md#schedules: create, read, list, change, pause, resume, run now and delete a
schedule, each owned by its user; a clock that cannot tick is a clear 400 that writes nothing."""

import pytest
from django_q.models import Schedule as QSchedule

from agenttasks.models import Schedule

from .conftest import error

pytestmark = pytest.mark.django_db(transaction=True)


def create(api, **fields):
    body = {"agentId": "echo", "input": "summarise the tickets", "intervalSeconds": 60, **fields}
    response = api.post("/schedules", body)
    assert response.status_code == 201, response.json()
    return response


def test_a_schedule_is_created_read_listed_changed_and_deleted(as_alice):
    response = create(as_alice, label="digest", metadata={"team": "a"}, timezone="Europe/Paris")
    schedule = response.json()["schedule"]
    assert response["Location"] == f"/api/agents/schedules/{schedule['id']}"
    assert schedule["id"].startswith("sched_")
    assert {k: schedule[k] for k in ("agentId", "input", "label", "metadata")} == {
        "agentId": "echo",
        "input": "summarise the tickets",
        "label": "digest",
        "metadata": {"team": "a"},
    }
    assert (schedule["intervalSeconds"], schedule["timezone"], schedule["status"]) == (
        60,
        "Europe/Paris",
        "active",
    )
    assert (schedule["multitaskStrategy"], schedule["missedTicks"]) == ("reject", "run_late")
    assert "cron" not in schedule and schedule["nextRunAt"] > schedule["createdAt"]
    path = f"/schedules/{schedule['id']}"
    assert as_alice.get(path).json() == {"schedule": schedule}
    listed = as_alice.get("/schedules").json()
    assert [s["id"] for s in listed["schedules"]] == [schedule["id"]] and listed["total"] == 1

    changed = as_alice.patch(path, {"cron": "30 8 * * 1-5", "missedTicks": "skip"})
    assert changed.status_code == 200
    body = changed.json()["schedule"]
    assert (body["cron"], body["missedTicks"]) == ("30 8 * * 1-5", "skip")
    assert "intervalSeconds" not in body
    assert as_alice.delete(path).status_code == 204
    error(as_alice.get(path), 404, "NOT_FOUND", f"Schedule not found: {schedule['id']}")
    assert not QSchedule.objects.exists()


def test_pause_resume_and_run_now(as_alice):
    schedule = create(as_alice).json()["schedule"]
    path = f"/schedules/{schedule['id']}"
    paused = as_alice.post(f"{path}/pause").json()["schedule"]
    assert paused["status"] == "paused" and "nextRunAt" not in paused
    tick = as_alice.post(f"{path}/run").json()["tick"]
    assert (tick["scheduleId"], tick["outcome"]) == (schedule["id"], "created")
    task = as_alice.get(f"/tasks/{tick['taskId']}").json()["task"]
    assert (task["scheduleId"], task["input"]) == (schedule["id"], "summarise the tickets")
    resumed = as_alice.post(f"{path}/resume").json()["schedule"]
    assert resumed["status"] == "active" and resumed["nextRunAt"]


def test_a_schedule_is_its_owners_alone(as_alice, as_bob):
    schedule = create(as_alice).json()["schedule"]
    path = f"/schedules/{schedule['id']}"
    for call in (
        as_bob.get(path),
        as_bob.patch(path, {"input": "mine"}),
        as_bob.post(f"{path}/pause"),
        as_bob.post(f"{path}/run"),
        as_bob.delete(path),
    ):
        error(call, 403, "FORBIDDEN", "You do not have access to this schedule")
    assert as_bob.get("/schedules").json()["schedules"] == []
    assert Schedule.objects.get().input == "summarise the tickets"


@pytest.mark.parametrize(
    "fields, field, message",
    [
        ({"cron": "every day", "intervalSeconds": None}, "cron", "Invalid cron expression"),
        ({"cron": "0 9 * * *"}, "cron", "Give either cron or intervalSeconds, not both"),
        ({"intervalSeconds": 0}, "intervalSeconds", "intervalSeconds must be a whole number"),
        ({"intervalSeconds": "60"}, "intervalSeconds", "intervalSeconds must be a whole number"),
        ({"timezone": "Europe/Atlantis"}, "timezone", "Unknown time zone: 'Europe/Atlantis'"),
        ({"missedTicks": "later"}, "missedTicks", "missedTicks must be one of skip, run_late"),
    ],
)
def test_a_clock_that_cannot_tick_is_a_400_that_writes_nothing(as_alice, fields, field, message):
    body = {"agentId": "echo", "input": "x", "intervalSeconds": 60, **fields}
    found = error(as_alice.post("/schedules", body), 400, "VALIDATION_ERROR")
    assert found["message"].startswith(message)
    assert field in found["details"]["fields"]
    assert not Schedule.objects.exists() and not QSchedule.objects.exists()


def test_an_unknown_agent_or_conversation_is_a_404(as_alice):
    body = {"agentId": "nobody", "input": "x", "intervalSeconds": 60}
    error(as_alice.post("/schedules", body), 404, "NOT_FOUND", "Agent not found: nobody")
    body = {"conversationId": "conv_missing", "input": "x", "intervalSeconds": 60}
    error(as_alice.post("/schedules", body), 404, "NOT_FOUND")
    assert not Schedule.objects.exists()


def test_a_schedule_posts_into_its_owners_conversation(as_alice):
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    schedule = create(as_alice, agentId=None, conversationId=conversation["id"]).json()["schedule"]
    assert (schedule["conversationId"], schedule["agentId"]) == (conversation["id"], "echo")
    tick = as_alice.post(f"/schedules/{schedule['id']}/run").json()["tick"]
    assert tick["outcome"] == "posted" and tick["runId"].startswith("run_")
