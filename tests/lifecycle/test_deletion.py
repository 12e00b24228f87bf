"""Deletes that finish: an interrupted delete is resumed, and deleting a user stops their work.

A conversation tree is marked before it is stopped and deleted. A process killed between the
mark and the delete leaves the mark, which a repeated DELETE or the reaper turns into the delete
it was meant to be: rows and stored bytes. Deleting a user runs the same delete for each tree
they own before the ORM cascade, so their running work stops and their files go too.
"""

import os
import subprocess
import sys
import threading

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agenttasks import lifecycle
from agenttasks.exceptions import ActiveTaskLimit
from agenttasks.execution import reaper
from agenttasks.models import Conversation, Event, File, PendingAction, Run, Task, Wakeup
from agenttasks.store import files

from ..cluster import ROOT, database_env
from ..conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Dies (SIGKILL) right after the tree is marked: the worst moment for a delete to stop.
DIE_AFTER_THE_MARK = """
import os, signal, sys
import django
django.setup()
from agenttasks import lifecycle
lifecycle.recovery.stop_tree = lambda conversation_id: os.kill(os.getpid(), signal.SIGKILL)
lifecycle.delete_conversation(sys.argv[1])
"""


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


def tree_with_a_file(user, children: int = 1) -> tuple[str, list[str], str]:
    """A conversation with tasks spawned from it and a stored file: (root, tree, storage name)."""
    root = lifecycle.create_conversation(owner=user, agent_id="echo").id
    spawned = [lifecycle.spawn(root, "echo", f"child {i}") for i in range(children)]
    tree = [
        root,
        *Task.objects.filter(pk__in=[s.task_id for s in spawned]).values_list(
            "conversation_id", flat=True
        ),
    ]
    upload = files.Upload(index=0, name="notes.txt", mime_type="text/plain", content=b"bytes")
    (row,) = files.save([upload], conversation_id=root, owner=user, rules={})
    assert files.storage().exists(row.storage_name)
    return root, tree, row.storage_name


def kill_mid_delete(conversation_id: str, media) -> None:
    """Run a delete in a process of its own that is SIGKILLed between the mark and the delete."""
    done = subprocess.run(
        [sys.executable, "-c", DIE_AFTER_THE_MARK, conversation_id],
        cwd=ROOT,
        env={
            **os.environ,
            **database_env(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "MEDIA_ROOT": str(media),
        },
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr


def tree_rows(conversation_ids) -> int:
    return (
        sum(
            model.objects.filter(conversation_id__in=conversation_ids).count()
            for model in (Task, Run, Event, File, PendingAction, Wakeup)
        )
        + Conversation.objects.filter(pk__in=conversation_ids).count()
    )


def test_the_reaper_finishes_a_delete_killed_after_the_mark(user, media):
    root, tree, stored = tree_with_a_file(user)
    kill_mid_delete(root, media)
    assert Conversation.objects.filter(pk__in=tree, deleting_at__isnull=False).count() == 2
    assert files.storage().exists(stored)  # nothing was deleted yet
    assert reaper.preview()["interrupted_deletes"] == [root]
    reaper.reap()
    assert tree_rows(tree) == 0
    assert not files.storage().exists(stored)


def test_a_cluster_finishes_it_within_one_reaper_interval(user, media, start_cluster):
    root, tree, stored = tree_with_a_file(user)
    kill_mid_delete(root, media)
    start_cluster(REAP_INTERVAL=1, env={"MEDIA_ROOT": str(media)})
    # The reaper runs when the workers start and then every second.
    wait_for(lambda: tree_rows(tree) == 0, timeout=3, message="the tree deleted by the reaper")
    assert not files.storage().exists(stored)


def test_a_repeated_delete_resumes_it_and_answers_as_the_first(user, media):
    root, tree, stored = tree_with_a_file(user)
    kill_mid_delete(root, media)
    client = APIClient()
    client.force_authenticate(user)
    url = f"/api/agents/conversations/{root}"
    assert client.get(url).status_code == 404  # being deleted: gone for every reader
    answer = client.delete(url)
    assert answer.status_code == 204, answer.content
    assert tree_rows(tree) == 0 and not files.storage().exists(stored)
    assert client.delete(url).status_code == 404


@override_settings(AGENTTASKS={"MAX_ACTIVE_TASKS_PER_USER": 2})
def test_an_interrupted_tree_counts_toward_no_limit(user, media):
    root, _, _ = tree_with_a_file(user, children=2)  # two active tasks: the limit
    with pytest.raises(ActiveTaskLimit):
        lifecycle.create(owner=user, agent_id="echo", input="one too many")
    kill_mid_delete(root, media)
    assert lifecycle.create(owner=user, agent_id="echo", input="room again").status == "pending"


def test_deleting_a_user_stops_their_work_and_removes_their_files(media, start_cluster):
    owner = get_user_model().objects.create_user("leaving")
    other = get_user_model().objects.create_user("staying")
    cluster = start_cluster(env={"MEDIA_ROOT": str(media)})
    slow = lifecycle.create(owner=owner, agent_id="slow", input="long", metadata={"seconds": 60})
    wait_for(
        lambda: Task.objects.get(pk=slow.id).status == "running",
        timeout=30,
        message="the slow task running",
    )
    _, tree, stored = tree_with_a_file(owner)
    kept = lifecycle.create(owner=other, agent_id="echo", input="mine")
    trees = [slow.conversation_id, *tree]
    owner.delete()
    # The worker executing the slow run stops at once, not after its 60 seconds.
    wait_for(
        lambda: f"worker.tree_deleted run={slow.run_id}" in cluster.log(),
        timeout=10,
        message="the worker told the run is gone",
    )
    assert tree_rows(trees) == 0
    assert not Conversation.objects.filter(owner_id=owner.pk).exists()
    assert not files.storage().exists(stored)
    assert Task.objects.filter(pk=kept.id).exists()
    assert not Event.objects.filter(task_id=slow.id).exists()


def race_on_a_running_task(base: str, headers: dict, round_no: int) -> list[tuple[str, int, str]]:
    """Fire the 8 requests of one round at once at a running `slow` task; return the answers."""
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        created = client.post(
            "/tasks", json={"agentId": "slow", "input": f"r{round_no}", "metadata": {"seconds": 5}}
        )
    assert created.status_code == 201, created.text
    task = created.json()["task"]
    wait_for(
        lambda: Task.objects.filter(pk=task["id"], status="running").exists(),
        timeout=30,
        message="the task to run",
    )
    conversation = f"/conversations/{task['conversationId']}"
    requests = [
        ("DELETE", conversation, None, {}),
        ("DELETE", conversation, None, {}),
        ("POST", f"/tasks/{task['id']}/cancel", {}, {}),
        ("POST", f"/tasks/{task['id']}/cancel", {}, {}),
        # A keyed write runs in the request's own transaction (retried whole).
        ("POST", f"/tasks/{task['id']}/cancel", {}, {"Idempotency-Key": f"c{round_no}"}),
        ("POST", f"/tasks/{task['id']}/comments", {"content": "more"}, {}),
        ("POST", f"/tasks/{task['id']}/retry", {}, {}),
        ("POST", f"{conversation}/messages", {"content": "hello"}, {}),
    ]
    barrier = threading.Barrier(len(requests))
    codes: list[tuple[str, int, str]] = []

    def fire(method, path, body, extra):
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            barrier.wait()
            response = client.request(method, path, json=body, headers=extra)
        codes.append((f"{method} {path.rsplit('/', 1)[-1]}", response.status_code, response.text))

    threads = [threading.Thread(target=fire, args=request) for request in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    wait_for(
        lambda: not Conversation.objects.filter(pk=task["conversationId"]).exists(),
        timeout=30,
        message="the conversation to be deleted",
    )
    return codes


@pytest.mark.postgres
def test_deletes_cancels_and_writes_racing_on_a_running_task_never_fail(
    start_cluster, live_server, user
):
    """2 deletes of its conversation, 3 cancels, a comment, a retry and a message at once, on a
    running task, 20 rounds: each answers 2xx or 4xx, never a 5xx (they deadlocked: the delete
    locked the task's runs before the task)."""
    settings = {"MAX_ACTIVE_TASKS_PER_USER": 0, "HEARTBEAT_INTERVAL": 1}
    start_cluster(workers=2, **settings)
    headers = {"Authorization": f"Token {Token.objects.create(user=user).key}"}
    base = live_server.url + "/api/agents"
    with override_settings(AGENTTASKS=settings):
        codes = [c for n in range(20) for c in race_on_a_running_task(base, headers, n)]
    assert len(codes) == 20 * 8
    assert [c for c in codes if c[1] >= 500] == []
