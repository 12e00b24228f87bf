"""Chaos over HTTP: storms of stop/retry/comment/answer calls, and streams that keep reconnecting."""

import json
import random
import threading
import time
from collections import Counter

import httpx
import pytest
from django.test.utils import override_settings
from rest_framework.authtoken.models import Token

from agenttasks.models import Event, Slot, Task
from agenttasks.states import TERMINAL, is_allowed

from ..conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.chaos]

SETTINGS = {
    "HEARTBEAT_INTERVAL": 1,
    "LEASE_TIMEOUT": 4,
    "REAP_INTERVAL": 1,
    "MAX_ATTEMPTS": 50,
    "MAX_ACTIVE_TASKS_PER_USER": 0,
}
MIX = ["slow"] * 15 + ["approver"] * 10 + ["boom"] * 10 + ["clarify"] * 10 + ["echo"] * 5


class Http:
    """A real HTTP client for one token against the live server."""

    def __init__(self, base: str, token: str):
        self.client = httpx.Client(
            base_url=base + "/api/agents", timeout=30, headers={"Authorization": f"Token {token}"}
        )

    def call(self, method: str, path: str, body=None) -> httpx.Response:
        return self.client.request(method, path, json=body)


def storm(
    http: Http, tasks: list[dict], rng: random.Random, until: float, codes: Counter, lock
) -> None:
    while time.monotonic() < until:
        task = rng.choice(tasks)
        op = rng.choice(["stop", "stop_graceful", "retry", "comment", "answer"])
        if op == "answer":
            listed = http.call("GET", f"/conversations/{task['conversationId']}/actions")
            actions = listed.json().get("actions", []) if listed.status_code == 200 else []
            if not actions:
                continue
            response = http.call(
                "POST",
                f"/conversations/{task['conversationId']}/actions/{actions[0]['id']}",
                {"approved": rng.random() < 0.5},
            )
        elif op.startswith("stop"):
            response = http.call(
                "POST", f"/tasks/{task['id']}/cancel", {"graceful": op == "stop_graceful"}
            )
        elif op == "retry":
            response = http.call("POST", f"/tasks/{task['id']}/retry")
        else:
            response = http.call(
                "POST", f"/tasks/{task['id']}/comments", {"content": f"more {rng.random()}"}
            )
        with lock:
            codes[(op, response.status_code)] += 1


def transitions_are_allowed(task: Task) -> list[str]:
    """Walk the task's own task.status events: each must chain and follow the table."""
    problems, previous = [], None
    for event in Event.objects.filter(
        conversation_id=task.conversation_id, type="task.status"
    ).order_by("seq"):
        frm, to = event.data.get("from"), event.data["to"]
        if frm != previous or not is_allowed(frm, to):
            problems.append(f"{task.id}: {previous} -> ({frm} -> {to})")
        previous = to
    if previous != task.status:
        problems.append(f"{task.id}: log ends at {previous}, row is {task.status}")
    return problems


@override_settings(AGENTTASKS=SETTINGS)
def test_storms_of_operations(start_cluster, live_server, user):
    start_cluster(workers=2, **SETTINGS)
    token = Token.objects.create(user=user).key
    http = Http(live_server.url, token)
    rng = random.Random(7)
    tasks = []
    for i, agent in enumerate(MIX):
        metadata = {"seconds": rng.choice([1, 2])} if agent == "slow" else {}
        created = http.call(
            "POST", "/tasks", {"agentId": agent, "input": f"job {i}", "metadata": metadata}
        )
        assert created.status_code == 201, created.text
        tasks.append(created.json()["task"])
    codes: Counter = Counter()
    lock = threading.Lock()
    until = time.monotonic() + 15
    threads = [
        threading.Thread(
            target=storm,
            args=(Http(live_server.url, token), tasks, random.Random(i), until, codes, lock),
        )
        for i in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    server_errors = sum(n for (op, code), n in codes.items() if code >= 500)
    assert server_errors == 0, codes

    # Let everything end: cancel what still waits on a person, then wait for the rest.
    def settled():
        for task in Task.objects.filter(status="waiting_for_input"):
            http.call("POST", f"/tasks/{task.id}/cancel")
        return not Task.objects.exclude(status__in=TERMINAL).exists()

    wait_for(settled, timeout=120, interval=0.5, message="every task to end")
    problems = [p for task in Task.objects.all() for p in transitions_are_allowed(task)]
    assert problems == []
    print(
        json.dumps(
            {
                "tasks": len(tasks),
                "threads": 16,
                "calls": sum(codes.values()),
                "by_status": {str(k): v for k, v in sorted(codes.items())},
                "server_errors": server_errors,
                "inconsistent_transitions": len(problems),
            }
        )
    )


def read_stream(
    base: str,
    token: str,
    conversation_id: str,
    last_seq: threading.Event,
    final: dict,
    rng: random.Random,
    received: list,
) -> None:
    """Read events, drop the connection after a few, reconnect with Last-Event-ID, until the end."""
    resume = 0
    with httpx.Client(timeout=30) as client:
        while True:
            headers = {"Authorization": f"Token {token}"}
            if resume:
                headers["Last-Event-ID"] = str(resume)
            request = client.build_request(
                "GET",
                f"{base}/api/agents/conversations/{conversation_id}/events/stream?after=0",
                headers=headers,
            )
            response = client.send(request, stream=True)
            budget = rng.randint(1, 12)
            try:
                message: dict = {}
                for line in response.iter_lines():
                    if line:
                        field, _, value = line.partition(":")
                        message[field] = value[1:] if value.startswith(" ") else value
                        continue
                    if "id" in message:
                        received.append(json.loads(message["data"]))
                        resume = int(message["id"])
                        budget -= 1
                    message = {}
                    if last_seq.is_set() and resume >= final["seq"]:
                        return
                    if budget <= 0:
                        break  # drop the connection mid-stream
            finally:
                response.close()


# 20 clients of one user reconnect at random: the stream cap is raised, so that every drop still
# takes and gives back a place.
@override_settings(
    AGENTTASKS={**SETTINGS, "STREAM_KEEPALIVE_SECONDS": 1, "MAX_STREAMS_PER_USER": 1000}
)
def test_stream_resumption_under_churn(start_cluster, live_server, user):
    start_cluster(workers=2, **SETTINGS)
    token = Token.objects.create(user=user).key
    http = Http(live_server.url, token)
    conversation = http.call("POST", "/conversations", {"agentId": "echo"}).json()["conversation"]
    last_seq, final = threading.Event(), {}
    clients = []
    for i in range(20):
        received: list = []
        thread = threading.Thread(
            target=read_stream,
            args=(
                live_server.url,
                token,
                conversation["id"],
                last_seq,
                final,
                random.Random(i),
                received,
            ),
        )
        clients.append((thread, received))
        thread.start()
    for i in range(30):
        posted = http.call(
            "POST", f"/conversations/{conversation['id']}/messages", {"message": f"m{i}"}
        )
        assert posted.status_code == 202, posted.text
        run_id = posted.json()["run"]["id"]
        wait_for(
            lambda r=run_id: Event.objects.filter(run_id=r, type="run.finished").exists(),
            timeout=30,
        )
    log = list(Event.objects.filter(conversation_id=conversation["id"]).order_by("seq"))
    final["seq"] = log[-1].seq
    last_seq.set()
    for thread, _ in clients:
        thread.join(120)
    expected = [e.seq for e in log]
    for thread, received in clients:
        assert not thread.is_alive()
        assert [e["seq"] for e in received] == expected  # no gap, no duplicate, in order
        assert [e["id"] for e in received] == [e.id for e in log]
    # Every dropped connection gave its place back.
    wait_for(lambda: not Slot.objects.exists(), timeout=10, message="every stream's place back")
    print(json.dumps({"clients": 20, "events": len(expected), "gaps": 0, "duplicates": 0}))
