"""A run's work survives a lost database connection: its ending, whatever path writes it (the
driver's `reconnecting` retries a lost connection even when a lookup on the way wrapped it in
another error, `meta_for`'s SpawnError), and a model answer that arrived while the pool's
connections died."""

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection, connections
from django.test import Client

from agenttasks import lifecycle, store
from agenttasks.models import Event, Run, Task
from agenttasks.runtime.base import Reply
from agenttasks.runtime.driver import drive, worker_identity
from agenttasks.states import RunStatus
from agenttasks.store.faults import reconnecting
from agenttasks.types import RunOutcome

from ..conftest import wait_for
from ..factories import ConversationFactory, RunFactory
from ..fake_model import answer, hold, in_thread

pytest_plugins = ["tests.fake_model"]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

TASKS = 10


def lose_the_connection() -> None:
    """End this process's database session from another one, as a restart would: the next
    statement on it fails with a lost connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
    finally:
        other.close()


def test_a_conversation_turns_ending_is_recorded_across_a_lost_connection(user):
    conversation = ConversationFactory(owner=user)
    run = RunFactory(conversation=conversation, status=RunStatus.RUNNING)
    outcome = RunOutcome(run.id, "completed", text="the answer")
    lose_the_connection()  # meta_for's lookup, the first statement, finds it gone
    reconnecting(lambda: lifecycle.on_run_finished(conversation.id, outcome))
    ended = Run.objects.get(pk=run.id)
    assert (ended.status, ended.output) == ("completed", "the answer")
    reply = Event.objects.get(conversation_id=conversation.id, type="message.assistant")
    assert reply.data["content"] == "the answer"


def test_a_run_that_lost_its_connection_is_retried_by_the_policy(agents, user, recording_queue):
    from ..lifecycle.test_retry_policy import FAST, runs_of, settle

    lost = []

    def lose_once(ctx):
        if not lost:
            lost.append(1)
            lose_the_connection()
            Run.objects.count()
        return Reply(content="done")

    agents("fragile", runtime="callable", handler=lose_once, retry=FAST)
    task = settle(lifecycle.create(owner=user, agent_id="fragile", input="go"), recording_queue)
    assert (task.status, task.result, task.attempt) == ("completed", "done", 2)
    assert runs_of(task)[0].error == "The database could not be reached"


def end_idle_sessions(application_name: str) -> int:
    """Terminate a cluster's idle database sessions (its pooled connections), as a PostgreSQL
    restart or a network blip would; return how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s AND state = 'idle'",
            [application_name],
        )
        return cursor.fetchone()[0]


def test_a_model_answer_that_arrived_is_recorded_when_the_pool_lost_its_connections(
    start_cluster, model, user
):
    model.set(
        AGENTS={"chatter": {"runtime": "chat", "model": "m-chat", "stream": False}},
        MAX_ACTIVE_TASKS_PER_USER=0,
    )
    thinking, answered = threading.Event(), threading.Event()
    asked = []

    def think(request):
        asked.append(1)
        if len(asked) >= TASKS:
            thinking.set()
        answered.wait(30)
        return answer("the answer")

    model.script(think)
    cluster = start_cluster(workers=1, **model.values)
    ids = [
        lifecycle.create(owner=user, agent_id="chatter", input=f"q {i}").id for i in range(TASKS)
    ]
    assert thinking.wait(60), "every run asked its model"
    assert end_idle_sessions(cluster.application_name) > 0
    answered.set()
    wait_for(
        lambda: not Task.objects.filter(pk__in=ids, status__in=["pending", "running"]).exists(),
        timeout=60,
        message="the tasks to end",
    )
    ended = dict(Task.objects.filter(pk__in=ids).values_list("status", "result").distinct())
    assert ended == {"completed": "the answer"}


def test_a_request_that_finds_the_connection_lost_is_a_503_and_the_next_one_is_served(user):
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=user).key
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    lose_the_connection()
    refused = client.get("/api/agents/tasks")
    assert refused.status_code == 503
    assert refused["Retry-After"] == "1"
    assert refused.json() == {
        "error": {
            "code": "SERVICE_UNAVAILABLE",
            "message": "The service is briefly unavailable; try again in a moment",
        }
    }
    assert client.get("/api/agents/tasks").status_code == 200


@pytest.fixture
def pooled_server(transactional_db):
    """The app served by gunicorn with the demo's pooled settings, as the README serves it; its
    URL and the application name of its database sessions."""
    from ..cluster import ROOT, database_env
    from ..mcp_support import free_port

    port, name = free_port(), f"agenttasks-test-web-{os.getpid()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "project.wsgi:application", f"--bind=127.0.0.1:{port}"]
        + ["--workers=1", "--worker-class=gthread", "--threads=8"],
        cwd=ROOT,
        env={
            **os.environ,
            **database_env(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DB_POOL": "1",
            "PGAPPNAME": name,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/api/agents/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(answers, timeout=30, interval=0.2, message="gunicorn answers")
        yield url, name
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def test_the_pooled_web_server_survives_its_connections_dying_without_a_500(pooled_server, user):
    from rest_framework.authtoken.models import Token

    url, name = pooled_server
    headers = {"Authorization": f"Token {Token.objects.create(user=user).key}"}
    tasks = f"{url}/api/agents/tasks"
    with ThreadPoolExecutor(8) as pool:  # the pool opens a connection for each thread
        assert set(
            pool.map(lambda _: httpx.get(tasks, headers=headers).status_code, range(40))
        ) == {200}
    # As a PostgreSQL restart does: every idle pooled connection dies (how many the pool opened
    # for 8 threads depends on how the requests overlapped; two or more are needed to wait).
    assert end_idle_sessions(name) >= 2
    # Each request is answered at once: a pool that waited 1, 2, 4 s between the dead
    # connections it finds would time out.
    statuses = Counter(httpx.get(tasks, headers=headers, timeout=3).status_code for _ in range(40))
    assert statuses == Counter({200: 40}), statuses


def test_a_check_warns_when_reused_connections_are_not_checked(monkeypatch):
    from agenttasks.checks import check_connection_health

    settings_dict = connection.settings_dict
    monkeypatch.setitem(settings_dict, "OPTIONS", {**settings_dict.get("OPTIONS", {})})
    monkeypatch.setitem(settings_dict, "CONN_MAX_AGE", 0)
    settings_dict["OPTIONS"]["pool"] = {"max_size": 4}
    monkeypatch.setitem(settings_dict, "CONN_HEALTH_CHECKS", False)
    assert [m.id for m in check_connection_health()] == ["agenttasks.W011"]
    settings_dict["CONN_HEALTH_CHECKS"] = True
    assert check_connection_health() == []
    settings_dict["OPTIONS"].pop("pool")
    settings_dict["CONN_HEALTH_CHECKS"] = False
    assert check_connection_health() == []  # a new connection each time: nothing goes stale


def run_chat_task(user, *, before=None) -> Task:
    """Create a chat task, claim its run here, call `before`, and drive the run to its end."""
    task = lifecycle.create(owner=user, agent_id="chatter", input="q")
    run = store.claim(task.run_id, worker_identity())
    if before is not None:
        before()
    drive(run, worker_identity())
    return Task.objects.get(pk=task.id)


def replies(task: Task) -> list[str]:
    kept = Event.objects.filter(conversation_id=task.conversation_id, type="message.assistant")
    return [event.data["content"] for event in kept.order_by("seq")]


@pytest.fixture
def chatter(model, agents, recording_queue):
    agents("chatter", model="m-chat", stream=False)
    model.script(lambda request: answer("the answer"))


def test_a_chat_run_whose_connection_was_lost_before_its_first_turn_completes(chatter, user):
    # The transcript's read, the run's first statement, finds the connection gone.
    ended = run_chat_task(user, before=lose_the_connection)
    assert (ended.status, ended.result, ended.error) == ("completed", "the answer", "")


@pytest.mark.parametrize("commit_went_through", [False, True])
def test_a_reply_appended_across_a_lost_connection_is_written_once(
    chatter, user, monkeypatch, commit_went_through
):
    append = store.append_events
    lost = []

    def append_losing_the_connection(conversation_id, events):
        if lost or events[0][0] != "message.assistant":
            return append(conversation_id, events)
        lost.append(1)
        if commit_went_through:
            append(conversation_id, events)  # committed; then its answer never arrives
        lose_the_connection()
        return append(conversation_id, events)

    monkeypatch.setattr(store, "append_events", append_losing_the_connection)
    ended = run_chat_task(user)
    assert lost and (ended.status, ended.result) == ("completed", "the answer")
    assert replies(ended) == ["the answer"]


def test_a_steered_message_taken_as_the_connection_broke_is_answered(
    model, agents, user, monkeypatch
):
    agents("chatter", model="m-chat", stream=False)
    steered = lambda request: Run.objects.filter(steers=1).exists()  # noqa: E731
    server = model.script(
        lambda r: (
            hold(steered, deadline=10, then=answer("About dogs."))
            if len(r.messages) == 1
            else answer("About dogs, and cats.")
        )
    )
    take = store.take_steers
    lost = []

    def take_losing_the_connection(run_id):
        taken = take(run_id)  # committed; then its answer never arrives
        if taken and not lost:
            lost.append(1)
            lose_the_connection()
            Run.objects.count()
        return taken

    monkeypatch.setattr(store, "take_steers", take_losing_the_connection)
    conversation = lifecycle.create_conversation(owner=user, agent_id="chatter")
    run, _ = lifecycle.post_message(conversation.id, "Write about dogs")
    claimed = store.claim(run.id, worker_identity())
    thread = in_thread(drive, claimed, worker_identity())
    wait_for(lambda: server.of("m-chat"), message="the first model request")
    lifecycle.post_message(conversation.id, "and cats", strategy="steer")
    thread.join(20)
    assert lost and Run.objects.get(pk=run.id).status == "completed"
    second = server.of("m-chat")[1]  # the steered message was answered in a second turn
    assert second.messages[-1] == {"role": "user", "content": "and cats"}
    replies = Event.objects.filter(conversation_id=conversation.id, type="message.assistant")
    assert [e.data["content"] for e in replies.order_by("seq")] == [
        "About dogs.",
        "About dogs, and cats.",
    ]
