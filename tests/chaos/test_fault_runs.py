"""Chaos: 300 chat tasks with callbacks and 60 conversation turns through four real faults
(`make fuzz`, AGENTTASKS_SOAK=1): a graceful SIGTERM of the cluster, a SIGKILL of it, a
PostgreSQL restart, and `pg_terminate_backend` of every session of the cluster. Each run prints
its counts: tasks ended, answers recorded, callbacks received, turns ended.

What must hold whatever the fault: every task ends, every ending's callback arrives (at least
once, each with its `X-Agenttasks-Delivery` id), every conversation turn ends. And where no
process died with its runs (all but the SIGKILL), every answer is recorded: no task and no turn
fails. A SIGKILL fails the runs it interrupted ("The server stopped while the task was running"),
whose failed callbacks arrive too.
"""

import os
import time
from collections import Counter

import pytest
from django.db import InterfaceError, OperationalError, connection
from django.test.utils import override_settings

from agenttasks import lifecycle
from agenttasks.models import Run, Task

from ..conftest import wait_for
from ..fake_model import stream_answer
from .test_database_restart import restart_postgres

pytest_plugins = ["tests.fake_model"]
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.chaos,
    pytest.mark.skipif(not os.environ.get("AGENTTASKS_SOAK"), reason="make fuzz runs the faults"),
]

TASKS, TURNS = 300, 60
SETTINGS = {
    "AGENTS": {"chatter": {"runtime": "chat", "model": "m-chat"}},
    "MAX_ACTIVE_TASKS_PER_USER": 0,
    "LEASE_TIMEOUT": 4,
    "HEARTBEAT_INTERVAL": 1,
    "REAP_INTERVAL": 1,
    "REQUEUE_AFTER": 3,
    "SHUTDOWN_GRACE": 20,
    "CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"],
    "WORKER_SLOTS": 50,
}
TERMINAL = ("completed", "failed", "cancelled")


def answering(request):
    """Answer each question after a second, streamed, naming it: the answer says which it was."""
    question = request.messages[-1]["content"]
    time.sleep(1.0)
    return stream_answer(["answer to ", question])


def tolerant(read):
    """Call `read`, reconnecting while the database is away (a restart); None meanwhile."""
    try:
        return read()
    except (OperationalError, InterfaceError):
        connection.close()
        return None


def inject(fault: str, cluster, start_cluster, settings: dict):
    """Strike once the work is in flight; return the cluster that serves the rest."""
    if fault == "sigterm":
        cluster.stop()  # graceful: its runs get SHUTDOWN_GRACE, its callbacks their POST
        return start_cluster(workers=2, **settings)
    if fault == "sigkill":
        cluster.kill()
        return start_cluster(workers=2, **settings)
    if fault == "restart":
        restart_postgres()
        connection.close()
        return cluster
    with connection.cursor() as cursor:  # terminate: every session of the cluster, at once
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [cluster.application_name],
        )
    return cluster


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", ["sigterm", "sigkill", "restart", "terminate"])
def test_a_fault_under_load_loses_no_task_callback_or_turn(
    fault, start_cluster, model, user, receiver
):
    model.set(**SETTINGS)
    model.script(answering)
    with override_settings(AGENTTASKS={**model.values}):
        cluster = start_cluster(workers=2, **model.values)
        tasks = [
            lifecycle.create(
                owner=user, agent_id="chatter", input=f"q{i}", callback_url=receiver.url
            ).id
            for i in range(TASKS)
        ]
        conversations = [
            lifecycle.create_conversation(owner=user, agent_id="chatter").id for _ in range(TURNS)
        ]
        turns = [
            lifecycle.post_message(c, f"t{i}", author=user)[0].id
            for i, c in enumerate(conversations)
        ]
        wait_for(
            lambda: Run.objects.filter(status="running").count() >= 20,
            timeout=60,
            message="work in flight",
        )
        started = time.monotonic()
        cluster = inject(fault, cluster, start_cluster, model.values)

        def ended() -> bool:
            open_tasks = Task.objects.filter(pk__in=tasks).exclude(status__in=TERMINAL).exists()
            open_turns = Run.objects.filter(pk__in=turns).exclude(status__in=TERMINAL).exists()
            return not open_tasks and not open_turns

        wait_for(lambda: tolerant(ended), timeout=300, interval=0.5, message="every task and turn")
        settled = dict(Task.objects.filter(pk__in=tasks).values_list("id", "status"))
        owed = {(task_id, status) for task_id, status in settled.items()}
        wait_for(
            lambda: owed <= {(b["taskId"], b["status"]) for b in receiver.bodies()},
            timeout=120,
            interval=0.5,
            message="every ending's callback",
        )
        seconds = time.monotonic() - started

    results = dict(Task.objects.filter(pk__in=tasks).values_list("id", "result"))
    answered = [i for i, t in enumerate(tasks) if results[t] == f"answer to q{i}"]
    turn_statuses = Counter(Run.objects.filter(pk__in=turns).values_list("status", flat=True))
    received = Counter((b["taskId"], b["status"]) for b in receiver.bodies())
    ids = {r["headers"].get("X-Agenttasks-Delivery") for r in receiver.requests}
    counts = {
        "fault": fault,
        "tasks": TASKS,
        "ended": sum(1 for s in settled.values() if s in TERMINAL),
        "statuses": dict(Counter(settled.values())),
        "errors": dict(
            Counter(
                Task.objects.filter(pk__in=tasks, status="failed").values_list("error", flat=True)
            )
        ),
        "answers recorded": len(answered),
        "callbacks received": len(receiver.requests),
        "endings called back": len(received),
        "sent more than once": sum(1 for n in received.values() if n > 1),
        "turns": dict(turn_statuses),
        "seconds after the fault": round(seconds, 1),
    }
    print(f"\nfault run: {counts}")
    assert counts["ended"] == TASKS
    assert None not in ids and len(ids) == len(received)  # one delivery id per ending
    assert sum(turn_statuses.values()) == TURNS and set(turn_statuses) <= set(TERMINAL)
    if fault != "sigkill":
        assert len(answered) == TASKS, counts
        assert turn_statuses == {"completed": TURNS}, counts
