"""Chaos: SIGKILL random workers under load; nothing is lost, nothing happens twice."""

import json
import os
import random
import signal
import time
from collections import Counter

import pytest
from django.db import connection
from django.test.utils import override_settings

from agenttasks import lifecycle, store
from agenttasks.exceptions import TaskError
from agenttasks.models import Delivery, Event, Run, Task, Wakeup
from agenttasks.states import TERMINAL

from ..conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.chaos]

ORPHAN = store.ORPHAN_TEXT
SETTINGS = {
    "MAX_ACTIVE_TASKS_PER_USER": 0,
    "LEASE_TIMEOUT": 4,
    "HEARTBEAT_INTERVAL": 1,
    "REAP_INTERVAL": 1,
    "REQUEUE_AFTER": 5,
    "MAX_DEPTH": 2,
    "MAX_ATTEMPTS": 20,
    "CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"],
}


def mixed_load(user, receiver, rng, n):
    """Create n tasks: echo (some with callbacks), slow 1-3 s, flaky, and spawning parents."""
    kinds = ["echo"] * 70 + ["slow"] * 8 + ["flaky"] * 10 + ["lead"] * 12
    ids = []
    for i in range(n):
        agent = rng.choice(kinds)
        metadata = {"seconds": rng.choice([1, 2, 3])} if agent == "slow" else None
        callback = receiver.url if agent == "echo" and i % 7 == 0 else None
        task = lifecycle.create(
            owner=user, agent_id=agent, input=f"job {i}", metadata=metadata, callback_url=callback
        )
        ids.append(task.id)
    return ids


def unsettled(top_ids):
    """Count live tasks, failed top-level tasks and pending wake-ups in one snapshot.

    One statement: counted one after another, a wake-up delivered between the counts (it re-opens
    its completed parent in the same commit) would be seen as neither owed nor live.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM agenttasks_task WHERE status <> ALL(%s)),"
            " (SELECT count(*) FROM agenttasks_task WHERE status = 'failed' AND id = ANY(%s)),"
            " (SELECT count(*) FROM agenttasks_wakeup WHERE state = 'pending')",
            [sorted(TERMINAL), list(top_ids)],
        )
        return cursor.fetchone()


def runs_of(task_id):
    """Say how each run of a task ended (for an assertion's message)."""
    return list(
        Run.objects.filter(task_id=task_id)
        .order_by("created_at")
        .values_list("trigger", "status", "stop_request", "error", "worker")
    )


def retry_failed(top_ids):
    """Retry every failed top-level task (flaky's first attempt, runs a kill failed)."""
    retried = 0
    for task in Task.objects.filter(pk__in=top_ids, status="failed"):
        try:
            lifecycle.retry(task.id)
            retried += 1
        except TaskError:
            pass
    return retried


@override_settings(AGENTTASKS=SETTINGS)
@pytest.mark.timeout(480)  # its own deadline (420 s) says what did not settle
def test_worker_kills_under_load(start_cluster, user, receiver):
    rng = random.Random(20261129)
    cluster = start_cluster(workers=4, **SETTINGS)
    top_ids = mixed_load(user, receiver, rng, 1000)
    kills = retries = 0
    deadline = time.monotonic() + 420
    next_kill = time.monotonic() + 2
    while True:
        now = time.monotonic()
        assert now < deadline, "the load did not settle in time"
        if now >= next_kill and kills < 12:
            pids = cluster.worker_pids()
            if pids:
                os.kill(rng.choice(pids), signal.SIGKILL)  # django-q2 reincarnates the worker
                kills += 1
            next_kill = now + rng.uniform(2, 4)
        retries += retry_failed(top_ids)
        if unsettled(top_ids) == (0, 0, 0) and kills >= 3:
            break
        time.sleep(0.5)

    tasks = list(Task.objects.all())
    children = [t for t in tasks if t.parent_conversation_id]
    unfinished = [
        (t.id, t.agent, t.status, t.stop_reason, t.summary, t.error, t.attempt)
        for t in tasks
        if t.id in set(top_ids) and t.status != "completed"
    ]
    assert not unfinished, [(u, runs_of(u[0])) for u in unfinished]
    assert all(t.status in ("completed", "failed", "cancelled") for t in tasks)

    # Runs a kill interrupted were failed by the reaper with the recovery message.
    orphaned = Run.objects.filter(error=ORPHAN)
    assert all(r.status == "failed" for r in orphaned)

    # No task has two final status events for one run (mirrors in a parent's log aside).
    own = {t.id: t.conversation_id for t in tasks}
    finals = [
        (e.task_id, e.data["runId"], e.data["to"])
        for e in Event.objects.filter(
            type="task.status", data__to__in=["completed", "failed", "cancelled"]
        )
        if own.get(e.task_id) == e.conversation_id
    ]
    endings = Counter((task_id, run_id) for task_id, run_id, _ in finals)
    duplicates = sum(1 for count in endings.values() if count > 1)
    assert duplicates == 0

    # Every parent got each child's completed or failed ending exactly once.
    lost = twice = 0
    for child in children:
        settled = Wakeup.objects.filter(task=child, state__in=["delivered", "consumed"]).count()
        owed = Wakeup.objects.filter(task=child, state="pending").count()
        lines = sum(
            note.data["content"].count(f"({child.id})")
            for note in Event.objects.filter(
                conversation_id=child.parent_conversation_id, type="task.notification"
            )
        )
        lost += owed
        twice += max(0, lines - settled)
        assert lines == settled, (child.id, lines, settled)
    assert lost == 0 and twice == 0

    # Every callback owed was sent (at least once: a kill mid-POST leaves it to the reaper), and a
    # receiver that de-duplicates by X-Agenttasks-Delivery got each ending's once.
    wait_for(lambda: not Delivery.objects.exists(), timeout=60, interval=0.5, message="owed")
    by_id = {}
    for request in list(receiver.requests):
        by_id.setdefault(request["headers"]["X-Agenttasks-Delivery"], request["json"])
    sent = Counter((b["taskId"], b["status"]) for b in by_id.values())
    per_status = Counter((task_id, to) for task_id, _, to in finals)
    over = {key: count for key, count in sent.items() if count > per_status[key]}
    assert not over, over
    with_callback = {t.id for t in tasks if t.callback_url}
    unsent = [t.id for t in tasks if t.id in with_callback and (t.id, t.status) not in sent]
    assert not unsent, unsent

    print(
        json.dumps(
            {
                "tasks": len(tasks),
                "top_level": len(top_ids),
                "children": len(children),
                "kills": kills,
                "restarts": kills,
                "retries": retries,
                "orphaned_runs": orphaned.count(),
                "endings": sum(endings.values()),
                "callbacks": sum(sent.values()),
                "callbacks_sent_again": len(receiver.requests) - len(by_id),
                "duplicates_found": duplicates,
                "lost": lost,
            }
        )
    )
