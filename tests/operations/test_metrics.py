"""GET /api/agents/metrics: the Prometheus text format, from the database and durable counters."""

import socket
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agenttasks import lifecycle, store
from agenttasks.execution import reaper, worker
from agenttasks.lifecycle import schedules
from agenttasks.models import Counter, Run, Schedule, Task, TaskCount
from agenttasks.operations import metrics
from agenttasks.states import TickOutcome
from agenttasks.types import NewTask

from ..conftest import on_postgres, run_threads
from ..fake_model import answer, http, run_to_idle, task_for

pytest_plugins = ["tests.fake_model"]  # the `model` and `agents` fixtures

URL = "/api/agents/metrics"
ON = {"METRICS_ENABLED": True, "CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"], "MODEL_RETRIES": 0}


def scrape(client, **headers) -> dict:
    """Scrape and parse: {(sample name, frozenset(labels)): value}."""
    response = client.get(URL, **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db(transaction=True)
def test_a_scrape_after_a_known_workload(client, user, recording_queue, receiver, model, agents):
    with override_settings(AGENTTASKS={**settings.AGENTTASKS, **ON}):  # the model server's too
        # Two echo runs completed (1 + 2 = 3 tokens each), one boom run failed, with callbacks:
        # two delivered, one refused (nothing listens on its port).
        urls = [receiver.url, receiver.url, f"http://127.0.0.1:{closed_port()}/cb"]
        for agent_id, url in zip(("echo", "echo", "boom"), urls, strict=True):
            task = lifecycle.create(owner=user, agent_id=agent_id, input="x", callback_url=url)
            worker.execute_run(task.run_id)
        # A chat run: one model request answered, then one that fails (HTTP 500, no retries).
        agents("talker", model="m-talker")
        replies = [answer("hi"), http(500, b"boom")]
        model.script(lambda request: replies.pop(0))
        task_for(user, "talker", "one")
        run_to_idle(recording_queue)
        task_for(user, "talker", "two")
        run_to_idle(recording_queue)
        # Queued: one run waiting for two minutes; one running run whose worker died.
        waiting = store.create_task(NewTask(owner=user, agent="echo", input="wait"))
        Run.objects.filter(pk=waiting.run_id).update(
            queued_at=timezone.now() - timedelta(minutes=2)
        )
        dead = store.create_task(NewTask(owner=user, agent="echo", input="dead"))
        store.claim(dead.run_id, "gone")
        Run.objects.filter(pk=dead.run_id).update(
            heartbeat_at=timezone.now() - timedelta(minutes=5)
        )

        before = scrape(client)
        assert value(before, "agenttasks_tasks", status="completed") == 3
        assert value(before, "agenttasks_tasks", status="failed") == 2
        assert value(before, "agenttasks_tasks", status="pending") == 1
        assert value(before, "agenttasks_tasks", status="running") == 1
        assert value(before, "agenttasks_tasks", status="cancelled") == 0
        assert value(before, "agenttasks_runs_queued") == 1
        assert 120 <= value(before, "agenttasks_oldest_queued_run_seconds") < 180
        assert value(before, "agenttasks_runs_lease_expired") == 1
        assert value(before, "agenttasks_orphans_failed_total") == 0
        assert value(before, "agenttasks_callbacks_total", outcome="delivered") == 2
        assert value(before, "agenttasks_callbacks_total", outcome="failed") == 1
        assert value(before, "agenttasks_model_requests_total", outcome="ok") == 1
        assert value(before, "agenttasks_model_requests_total", outcome="error") == 1
        assert value(before, "agenttasks_tokens_total", agent="echo", kind="input") == 2
        assert value(before, "agenttasks_tokens_total", agent="echo", kind="output") == 4
        assert value(before, "agenttasks_tokens_total", agent="echo", kind="total") == 6
        assert value(before, "agenttasks_tokens_total", agent="talker", kind="total") == 2
        duration = "agenttasks_run_duration_seconds"
        assert value(before, f"{duration}_count", agent="echo", outcome="completed") == 2
        assert value(before, f"{duration}_count", agent="boom", outcome="failed") == 1
        assert value(before, f"{duration}_count", agent="talker", outcome="failed") == 1
        assert (
            value(before, f"{duration}_bucket", agent="echo", outcome="completed", le="+Inf") == 2
        )
        assert value(before, f"{duration}_bucket", agent="echo", outcome="completed", le="5.0") == 2
        assert 0 < value(before, f"{duration}_sum", agent="echo", outcome="completed") < 5

        # The reaper fails the dead run: counted durably, and the gauge drops.
        reaper.reap()
        after = scrape(client)
        assert value(after, "agenttasks_orphans_failed_total") == 1
        assert value(after, "agenttasks_runs_lease_expired") == 0
        assert value(after, "agenttasks_tasks", status="failed") == 3


@pytest.mark.django_db(transaction=True)
def test_nothing_is_counted_while_metrics_are_off(user, recording_queue):
    task = lifecycle.create(owner=user, agent_id="echo", input="x")
    worker.execute_run(task.run_id)
    metrics.count("agenttasks_callbacks_total", outcome="delivered")
    assert Task.objects.get(pk=task.id).status == "completed"
    assert not Counter.objects.exists()


@pytest.mark.django_db
@override_settings(AGENTTASKS={"METRICS_ENABLED": True})
def test_counters_are_rows_every_process_shares(client):
    metrics.count("agenttasks_callbacks_total", outcome="delivered")
    metrics.increment([("agenttasks_callbacks_total", {"outcome": "delivered"}, 2)])
    (row,) = Counter.objects.all()
    assert (row.name, row.labels, row.value) == (
        "agenttasks_callbacks_total",
        "outcome=delivered",
        3,
    )
    with override_settings(AGENTTASKS={"METRICS_ENABLED": True}):
        scrape(client)  # the first request of a process loads the URLconf and middleware
        with CaptureQueriesContext(connection) as one_counter:
            samples = scrape(client)
        metrics.increment(
            [("agenttasks_callbacks_total", {"outcome": f"o{n}"}, 1) for n in range(20)]
        )
        with CaptureQueriesContext(connection) as many_counters:
            scrape(client)
    assert value(samples, "agenttasks_callbacks_total", outcome="delivered") == 3
    # A scrape costs the same statements however many counters the processes wrote.
    assert len(many_counters.captured_queries) == len(one_counter.captured_queries)


@pytest.mark.django_db
def test_off_unless_enabled_and_guarded_by_its_token(client):
    with override_settings(AGENTTASKS={}):
        response = client.get(URL)
    assert response.status_code == 404
    assert response.json()["error"] == {
        "code": "NOT_FOUND",
        "message": f"Route not found: GET {URL} "
        "(metrics are off: set AGENTTASKS['METRICS_ENABLED'] = True)",
    }
    with override_settings(AGENTTASKS={"METRICS_ENABLED": True, "METRICS_TOKEN": "m3"}):
        refused = client.get(URL)
        assert refused.status_code == 401
        assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert client.get(URL, HTTP_AUTHORIZATION="Bearer nope").status_code == 401
        assert scrape(client, HTTP_AUTHORIZATION="Bearer m3")
        assert client.post(URL, HTTP_AUTHORIZATION="Bearer m3").status_code == 405


def _direct_counts() -> dict[str, int]:
    return {s: n for s, n in Task.objects.order_by().values_list("status").annotate(n=Count("pk"))}


@pytest.mark.skipif(not on_postgres(), reason="the task counts are kept by PostgreSQL triggers")
@pytest.mark.django_db(transaction=True)
def test_the_kept_task_counts_follow_every_write(user, recording_queue):
    """Creates, claims, endings, cancels and deletes from 8 threads at once: the counts the
    triggers keep equal a count of the table, and a status-neutral update writes none."""

    def work(i: int) -> None:
        for round_no in range(5):
            task = lifecycle.create(owner=user, agent_id="echo", input=f"{i}/{round_no}")
            if round_no % 3 == 0:
                worker.execute_run(task.run_id)
            elif round_no % 3 == 1:
                lifecycle.stop(task.id)

    results = run_threads(work, 8)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert metrics.tasks_by_status() == _direct_counts()
    assert sum(_direct_counts().values()) == 40
    before = list(TaskCount.objects.order_by("pk").values_list("status", "shard", "n"))
    Task.objects.filter(status="pending").update(label="renamed")  # no status changes
    assert list(TaskCount.objects.order_by("pk").values_list("status", "shard", "n")) == before
    lifecycle.delete_conversation(Task.objects.filter(status="completed").first().conversation_id)
    assert metrics.tasks_by_status() == _direct_counts()
    # One statement moving tasks out of two statuses: the row trigger counts each row.
    moved = Task.objects.filter(status__in=["completed", "cancelled"]).update(status="pending")
    assert moved > 0
    assert metrics.tasks_by_status() == _direct_counts()


@pytest.mark.django_db(transaction=True)
def test_queue_shares_delays_and_the_wait_before_a_claim(client, user):
    other = type(user).objects.create_user("b")
    later = timezone.now() + timedelta(hours=1)
    for owner, n in ((user, 3), (other, 1)):
        for i in range(n):
            store.create_task(NewTask(owner=owner, agent="echo", input=str(i)))
    store.create_task(NewTask(owner=user, agent="echo", input="later", not_before=later))
    Run.objects.update(queued_at=timezone.now() - timedelta(seconds=3))
    with override_settings(AGENTTASKS={"METRICS_ENABLED": True}):
        claimed = store.claim_many("host:1", 2).runs
        metrics.record_claims(claimed, timezone.now())
        samples = scrape(client)
    assert value(samples, "agenttasks_runs_delayed") == 1
    assert value(samples, "agenttasks_runs_queued_by_owner", owner=str(user.pk)) == 3
    assert value(samples, "agenttasks_runs_queued_by_owner", owner=str(other.pk)) is None
    wait = "agenttasks_run_queue_wait_seconds"
    assert value(samples, f"{wait}_count", trigger="initial") == 2
    assert value(samples, f"{wait}_bucket", trigger="initial", le="2.5") == 0
    assert value(samples, f"{wait}_bucket", trigger="initial", le="5.0") == 2


@pytest.mark.django_db
def test_schedule_ticks_by_outcome_and_the_active_schedules(client, user):
    made = [
        schedules.create_schedule(owner=user, agent_id="worker", input="x", interval=60, paused=p)
        for p in (False, False, True)
    ]
    due = "2026-01-01T00:00:00+00:00"
    with override_settings(AGENTTASKS={"METRICS_ENABLED": True}):
        assert schedules.fire(made[0].id, due).outcome == TickOutcome.CREATED
        assert schedules.fire(made[0].id, due).outcome == TickOutcome.CREATED  # found, not counted
        schedules.run_now(made[1].id)
        Schedule.objects.filter(pk=made[2].id).update(agent="gone")
        assert schedules.run_now(made[2].id).outcome == TickOutcome.REFUSED
        samples = scrape(client)
    ticks = "agenttasks_schedule_ticks_total"
    assert value(samples, ticks, outcome="created") == 2
    assert value(samples, ticks, outcome="refused") == 1
    assert value(samples, ticks, outcome="skipped") is None
    assert value(samples, "agenttasks_schedules_active") == 2
