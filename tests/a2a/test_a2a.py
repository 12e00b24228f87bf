# ruff: noqa: F811  (the fixtures imported from tests.a2a_support are parameters here)
"""A2A 1.0 over the same durable tasks (docs/a2a.md): a live server, a real django-q2 cluster and
the real a2a-sdk client, on both bindings (JSON-RPC and HTTP+JSON)."""

import httpx
import pytest
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError
from django.contrib.admin.utils import quote
from django.test import Client

from agenttasks.models import Task

from ..a2a_support import (  # noqa: F401  (fixtures)
    BINDINGS,
    HTTP_JSON,
    JSONRPC,
    PREFIX,
    State,
    alice,
    bob,
    card_url,
    cluster,
    peer,
    server,
    text_message,
    text_of,
)
from ..conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_card_describes_the_agent_and_both_bindings(peer):
    card = peer("docs", JSONRPC).card()
    root = card_url(peer("docs", JSONRPC).server, "docs")
    assert card.name == "docs"
    bindings = {i.protocol_binding: i for i in card.supported_interfaces}
    assert set(bindings) == {"JSONRPC", "HTTP+JSON"}
    assert bindings["JSONRPC"].url == root + "/"
    assert bindings["HTTP+JSON"].url == root + "/rest"
    assert {i.protocol_version for i in card.supported_interfaces} == {"1.0"}
    assert card.capabilities.streaming and card.capabilities.push_notifications
    assert "token" in card.security_schemes
    assert card.security_schemes["token"].api_key_security_scheme.name == "Authorization"
    assert [s.id for s in card.skills] == ["docs"]
    # `docs` accepts PDF and text files: its input modes say so.
    assert "application/pdf" in card.default_input_modes
    assert "application/pdf" not in peer("echo", JSONRPC).card().default_input_modes


def test_card_of_an_unexposed_or_opted_out_agent_is_not_found(server):
    from agenttasks import registry

    from ..agents import echo

    registry.register("private", runtime="callable", handler=echo, a2a=False, replace=True)
    try:
        for agent in ("internal", "private", "nobody"):
            url = card_url(server, agent) + "/.well-known/agent-card.json"
            assert httpx.get(url).status_code == 404
    finally:
        registry.unregister("private")


@pytest.mark.parametrize("binding", BINDINGS)
def test_send_blocking_to_echo(peer, alice, cluster, binding):
    client = peer("echo", binding)
    task = client.send(text_message("hi"))
    assert task.status.state == State.TASK_STATE_COMPLETED
    (artifact,) = task.artifacts
    assert text_of(artifact.parts) == "Echo: hi"
    assert [text_of(m.parts) for m in task.history] == ["hi", "Echo: hi"]
    # An A2A task is an agenttasks task: REST lists it, the admin shows it.
    rest = httpx.get(
        f"{client.server}{PREFIX}/tasks", headers={"Authorization": f"Token {alice.token}"}
    )
    assert [t["id"] for t in rest.json()["tasks"]] == [task.id]
    alice.is_staff = alice.is_superuser = True
    alice.save()
    admin = Client()
    admin.force_login(alice)
    page = admin.get(f"/admin/agenttasks/task/{quote(task.id)}/change/")
    assert page.status_code == 200 and "Echo: hi" in page.content.decode()


@pytest.mark.parametrize("binding", BINDINGS)
def test_send_non_blocking_then_get_until_done(peer, cluster, binding):
    client = peer("slow", binding)
    task = client.send(text_message("nap"), immediately=True, metadata={"seconds": 1})
    assert task.status.state in (State.TASK_STATE_SUBMITTED, State.TASK_STATE_WORKING)
    done = wait_for(
        lambda: (t := client.get(task.id)).status.state == State.TASK_STATE_COMPLETED and t,
        timeout=30,
        interval=0.2,
        message="the slow task completes",
    )
    assert text_of(done.artifacts[0].parts) == "Slept 1s"
    assert len(client.get(task.id, history_length=1).history) == 1
    assert len(client.get(task.id, history_length=0).history) == 0


@pytest.mark.parametrize("binding", BINDINGS)
def test_cancel_then_cancel_again(peer, cluster, binding):
    client = peer("slow", binding)
    task = client.send(text_message("long"), immediately=True, metadata={"seconds": 60})
    cancelled = client.cancel(task.id)
    assert cancelled.status.state == State.TASK_STATE_CANCELED
    assert Task.objects.get(pk=task.id).status == "cancelled"
    with pytest.raises(TaskNotCancelableError):
        client.cancel(task.id)


@pytest.mark.parametrize("binding", BINDINGS)
def test_list_tasks_walks_pages_newest_first(peer, cluster, binding):
    client = peer("echo", binding)
    first = client.send(text_message("one"))
    context = first.context_id
    made = [first.id] + [client.send(text_message(f"n{i}"), immediately=True).id for i in range(4)]
    seen, token = [], ""
    while True:
        page = client.list(page_size=2, page_token=token)
        assert page.total_size == 5 and len(page.tasks) <= 2
        seen += [t.id for t in page.tasks]
        token = page.next_page_token
        if not token:
            break
    assert seen == made[::-1]
    only = client.list(context_id=context)
    assert [t.id for t in only.tasks] == [first.id]
    done = client.list(status=State.TASK_STATE_COMPLETED, context_id=context)
    assert [t.id for t in done.tasks] == [first.id]


@pytest.mark.parametrize("binding", BINDINGS)
def test_isolation_unknown_ids_and_anonymous(peer, alice, bob, cluster, binding, settings):
    mine = peer("echo", binding).send(text_message("secret"), immediately=True)
    theirs = peer("echo", binding, user=bob)
    with pytest.raises(TaskNotFoundError):
        theirs.get(mine.id)
    with pytest.raises(TaskNotFoundError):
        theirs.cancel(mine.id)
    assert [t.id for t in theirs.list().tasks] == []
    with pytest.raises(TaskNotFoundError):
        peer("echo", binding).get("task_doesnotexist")
    anonymous = peer("echo", binding, user=None)
    with pytest.raises(Exception, match="401"):
        anonymous.send(text_message("hi"), immediately=True)
    settings.AGENTTASKS = {**settings.AGENTTASKS, "ALLOW_ANONYMOUS": True}
    task = anonymous.send(text_message("hi"), immediately=True)
    assert Task.objects.get(pk=task.id).owner_id is None


def test_the_readme_client_example_runs(server, alice, cluster, capsys):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## A2A\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace("http://127.0.0.1:8000", server).replace("<key>", alice.token)
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "TASK_STATE_COMPLETED Echo: hi"


def test_without_the_extra_the_app_loads_and_serves_no_a2a_route():
    import os
    import subprocess
    import sys

    from ..cluster import ROOT

    script = (
        "import sys; sys.modules['a2a'] = None\n"  # as if a2a-sdk were not installed
        "import django; django.setup()\n"
        "from django.urls import resolve\n"
        "from agenttasks import a2a, models\n"
        "print(a2a.available(), resolve('/api/agents/a2a/echo/').url_name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "route-not-found"]
