"""The hot path: claim, ending and create, pinned in statements and raced with real threads.

On PostgreSQL the claim and the ending are one statement each (SQL functions) and a REST create
is at most three after authentication; the races prove the single statements are still
compare-and-sets bound to the run.
"""

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from agenttasks import store
from agenttasks.a2a import notify
from agenttasks.broker import queue
from agenttasks.exceptions import ActiveTaskLimit
from agenttasks.lifecycle import effects
from agenttasks.models import A2APushConfig, Event, Task, Wakeup
from agenttasks.types import Ending, NewTask, RunOutcome

from ..conftest import run_threads

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 20
THREADS = 8


def spawned(parent) -> Task:
    return store.create_task(
        NewTask(parent_conversation_id=parent.pk, owner=parent.owner, agent="worker", input="x")
    )


@pytest.mark.postgres
def test_claim_is_one_statement(user, django_assert_num_queries):
    task = store.create_task(NewTask(owner=user, agent="worker", input="x"))
    with django_assert_num_queries(1):
        run = store.claim(task.run_id, "w1")
    assert run.status == "running" and run.task.status == "running"
    assert run.task.conversation_id == task.conversation_id


@pytest.mark.postgres
def test_ending_is_one_statement(parent, django_assert_num_queries):
    task = spawned(parent)
    store.claim(task.run_id, "w1")
    outcome = RunOutcome(task.run_id, "completed", text="done", usage={"totalTokens": 3})
    with django_assert_num_queries(1):
        ended = store.end(task.id, task.run_id, Ending("completed", result="done"), outcome=outcome)
    assert ended.recorded and ended.task.status == "completed"
    assert Wakeup.objects.get(task_id=task.id).status == "completed"  # with its debt


@pytest.mark.postgres
def test_an_ending_answers_what_its_effects_ask(parent, django_assert_num_queries):
    """The ending reads whether messages wait and the task's push configs under its lock, as the
    effects' own statements would after it; the effects then ask neither again."""
    quiet = spawned(parent)
    store.claim(quiet.run_id, "w1")
    ended = store.end(quiet.id, quiet.run_id, Ending("completed", result="done")).task
    assert (ended.messages_wait_at_end, ended.push_configs_at_end) == (False, [])
    with django_assert_num_queries(0):
        effects.own_run_boundary(ended)
        notify.on_task_updated(Task, task=ended)

    busy = spawned(parent)
    config = A2APushConfig.objects.create(task=busy, url="http://127.0.0.1:9/hook")
    store.claim(busy.run_id, "w1")
    store.send_to_busy_task(busy.id, "and this", strategy="enqueue")  # waits behind the run
    ended = store.end(busy.id, busy.run_id, Ending("completed", result="done")).task
    assert ended.messages_wait_at_end is True and store.messages_wait(busy.id)
    assert ended.push_configs_at_end == [config.pk]


@pytest.mark.postgres
def test_rest_create_is_at_most_three_statements_after_authentication(
    user, client, django_assert_max_num_queries
):
    token = Token.objects.create(user=user).key
    # The token lookup is authentication; everything after it is the create.
    with queue.use_backend(queue.DjangoQBackend()), django_assert_max_num_queries(1 + 3):
        answer = client.post(
            "/api/agents/tasks",
            {"agentId": "echo", "input": "hi"},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Token {token}",
        )
    assert answer.status_code == 201, answer.content
    task = Task.objects.get(pk=answer.json()["task"]["id"])
    assert answer.json()["task"]["runId"] == task.run_id and task.status == "pending"


@pytest.mark.postgres
def test_the_job_commits_with_the_task(user):
    """With the ORM broker on this database, the first run's job is written by the create."""
    from django_q.models import OrmQ
    from django_q.signing import SignedPackage

    from agenttasks import lifecycle

    with queue.use_backend(queue.DjangoQBackend()):
        task = lifecycle.create(owner=user, agent_id="echo", input="hi")
    (job,) = OrmQ.objects.all()
    package = SignedPackage.loads(job.payload)
    assert (package["func"], package["args"]) == (queue.EXECUTE_RUN, (task.run_id,))


@pytest.mark.postgres
def test_a_create_a_connection_ran_five_times_is_prepared(user):
    """The demo settings prepare statements (docs/installation.md#database-settings): from the
    sixth create on, PostgreSQL runs the one statement it parsed and planned once."""
    for _ in range(6):
        store.create_task(NewTask(owner=user, agent="worker", input="x"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [statement for (statement,) in cursor.fetchall()]
    assert any("agenttasks_create_task_v4" in statement for statement in prepared), prepared


def test_a_refused_create_writes_nothing(parent):
    store.create_task(NewTask(owner=parent.owner, agent="worker", input="x"), owner_limit=1)
    before = (Task.objects.count(), Event.objects.count())
    with pytest.raises(ActiveTaskLimit):
        store.create_task(NewTask(owner=parent.owner, agent="worker", input="y"), owner_limit=1)
    assert (Task.objects.count(), Event.objects.count()) == before


@pytest.mark.postgres
def test_eight_claims_one_winner_every_round(parent):
    for _ in range(ROUNDS):
        task = spawned(parent)
        results = run_threads(
            lambda i, t: store.claim(t.run_id, f"w{i}") is not None, THREADS, task
        )
        assert results.count(True) == 1, results
        assert Event.objects.filter(task_id=task.id, type="run.started").count() == 1
        store.finalize(task.id, task.run_id, "cancelled")


@pytest.mark.postgres
def test_eight_endings_one_winner_every_round(parent):
    for _ in range(ROUNDS):
        task = spawned(parent)
        store.claim(task.run_id, "w1")

        def end(i, t):
            status = "completed" if i % 2 else "failed"
            outcome = RunOutcome(t.run_id, status, text=f"answer {i}", error=f"error {i}")
            ending = Ending(status, summary=f"s{i}", result=f"answer {i}")
            ended = store.end(t.id, t.run_id, ending, outcome=outcome)
            return (ended.recorded, ended.task is not None)

        results = run_threads(end, THREADS, task)
        assert results.count((True, True)) == 1, results
        assert results.count((False, False)) == THREADS - 1, results
        events = Event.objects.filter(conversation_id=task.conversation_id)
        assert events.filter(type="run.finished").count() == 1
        assert events.filter(type="task.status", data__from="running").count() == 1
        assert Wakeup.objects.filter(task_id=task.id).count() == 1
        assert len(set(events.values_list("seq", flat=True))) == events.count()


def test_claim_and_ending_keep_their_contract_on_both_databases(parent):
    """The SQL functions and the ORM path answer alike (this runs on both databases)."""
    task = spawned(parent)
    run = store.claim(task.run_id, "w1")
    assert (run.status, run.worker, run.task.status) == ("running", "w1", "running")
    assert store.claim(task.run_id, "w2") is None
    outcome = RunOutcome(task.run_id, "completed", text="done", usage={"inputTokens": 2})
    ended = store.end(task.id, task.run_id, Ending("completed", result="done"), outcome=outcome)
    assert ended.recorded and (ended.task.status, ended.task.result) == ("completed", "done")
    again = store.end(task.id, task.run_id, Ending("failed", result="late"), outcome=outcome)
    assert (again.recorded, again.task) == (False, None)
    types = list(
        Event.objects.filter(conversation_id=task.conversation_id)
        .order_by("seq")
        .values_list("type", "data")
    )
    assert [t for t, _ in types] == [
        "message.user",
        "task.status",
        "run.started",
        "task.status",
        "message.assistant",
        "run.finished",
        "task.status",
    ]
    usage = {"inputTokens": 2, "outputTokens": 0, "totalTokens": 2}
    assert types[4][1] == {"content": "done", "usage": usage}
    assert types[5][1] == {"status": "completed", "usage": usage}
    assert types[6][1] == {
        "taskId": task.id,
        "from": "running",
        "to": "completed",
        "runId": task.run_id,
        "attempt": 1,
    }
