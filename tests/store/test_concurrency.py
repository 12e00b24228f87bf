"""Races on the store with real threads, each on its own database connection.

On PostgreSQL the row locks decide; on SQLite IMMEDIATE transactions serialize the writers, which
the SQLite siblings below prove with the same threads.
"""

import threading
import time

import pytest
from django.db import connection, transaction

from agenttasks import ids, store
from agenttasks.models import PendingAction, Run, Task, Wakeup
from agenttasks.store.locking import retried
from agenttasks.types import ActionRequest, NewTask

from ..conftest import on_postgres, run_threads

pytestmark = pytest.mark.django_db(transaction=True)

APPROVAL = ActionRequest(kind="approval", tool_name="deploy", tool_call_id="call-1", args={})


def started(parent):
    task = store.create_task(
        NewTask(parent_conversation_id=parent.pk, owner=parent.owner, agent="worker", input="do it")
    )
    assert store.claim(task.run_id, "w1")
    return Task.objects.get(pk=task.pk)


def finalizers(task, count):
    def finalize(i):
        status = "completed" if i % 2 == 0 else "failed"
        return bool(store.finalize(task.id, task.run_id, status, summary="r", result="r"))

    return run_threads(finalize, count)


@pytest.mark.postgres
def test_eight_concurrent_finalizers_have_one_winner(parent):
    # lifecycle 7.1.8
    task = started(parent)
    results = finalizers(task, 8)
    assert results.count(True) == 1, results
    assert Wakeup.objects.count() == 1
    assert Task.objects.get(pk=task.pk).status in ("completed", "failed")


@pytest.mark.postgres
def test_finalize_under_contention(parent):
    # lifecycle 7.8.2
    task = started(parent)
    results = finalizers(task, 6)
    assert results.count(True) == 1, results
    task.refresh_from_db()
    assert task.status in ("completed", "failed") and task.result == "r"
    statuses = task.conversation.events.filter(type="task.status", data__from="running")
    assert statuses.count() == 1


@pytest.mark.postgres
def test_retry_claim_under_contention(parent):
    # lifecycle 7.8.6: six claims with max 5 -> one winner at attempt 2.
    task = started(parent)
    store.finalize(task.id, task.run_id, "failed", summary="x", result="x")
    run_ids = [ids.new_run_id() for _ in range(6)]
    results = run_threads(lambda i: bool(store.retry_claim(task.id, run_ids[i], 5, None)), 6)
    assert results.count(True) == 1, results
    task.refresh_from_db()
    winner = run_ids[results.index(True)]
    assert (task.status, task.attempt, task.run_id, task.result) == ("pending", 2, winner, "")
    assert Run.objects.filter(task=task).count() == 2


@pytest.mark.postgres
def test_double_delivery_claims_once(parent):
    # lifecycle 7.9.1
    task = store.create_task(
        NewTask(parent_conversation_id=parent.pk, owner=parent.owner, agent="worker", input="x")
    )
    results = run_threads(lambda i: bool(store.claim(task.run_id, f"w{i}")), 2)
    assert results.count(True) == 1, results
    assert task.conversation.events.filter(type="run.started").count() == 1


def finalize_or_advance(i, task, next_run):
    if i == 0:
        return bool(store.finalize(task.id, task.run_id, "cancelled"))
    return bool(store.advance(task.id, task.run_id, next_run, input="next"))


def finalize_or_answer(i, task, action):
    if i == 0:
        return bool(store.finalize(task.id, task.run_id, "cancelled"))
    return bool(store.answer(task.id, task.run_id, action.id, {"status": "approved"}))


@pytest.mark.postgres
def test_finalize_racing_advance_ends_consistently(parent):
    for _ in range(10):
        task = started(parent)
        next_run = ids.new_run_id()
        results = run_threads(finalize_or_advance, 2, task, next_run)
        task.refresh_from_db()
        if results[0] and not results[1]:
            assert (task.status, task.run_id) == ("cancelled", task.run_id)
            assert not Run.objects.filter(pk=next_run).exists()
        else:
            # The advance won first; the finalize then names a run the task left and loses.
            assert results == [False, True], results
            assert (task.status, task.run_id) == ("pending", next_run)


@pytest.mark.postgres
def test_finalize_racing_reclaim_ends_consistently(parent):
    for _ in range(10):
        task = started(parent)
        store.pause(task.id, task.run_id, actions=[APPROVAL])
        action = PendingAction.objects.get(run_id=task.run_id)
        results = run_threads(finalize_or_answer, 2, task, action)
        task.refresh_from_db()
        action.refresh_from_db()
        run = Run.objects.get(pk=task.run_id)
        # The stop always ends the task; the answer either landed first (and resumed the run,
        # which the stop then cancelled) or found the task gone and was discarded.
        assert results[0] is True
        assert task.status == "cancelled" and run.status == "cancelled"
        assert action.status == ("approved" if results[1] else "cancelled")


def test_sqlite_immediate_transactions_serialize_writers(parent):
    """SQLite sibling: one writer holds BEGIN IMMEDIATE; the other waits for its commit."""
    if on_postgres():
        pytest.skip("proves SQLite's IMMEDIATE transaction mode")
    task = started(parent)
    holding = threading.Event()
    order = []

    def first():
        with transaction.atomic():
            holding.set()
            time.sleep(0.3)  # hold the write lock while the other thread tries to begin
            order.append("first commits")
        connection.close()

    def second():
        holding.wait(5)
        won = store.finalize(task.id, task.run_id, "completed", result="r")
        order.append("second wrote")
        connection.close()
        return won

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert order == ["first commits", "second wrote"]


def test_sqlite_concurrent_finalizers_have_one_winner(parent):
    """SQLite sibling of 7.1.8: the same eight threads, serialized by IMMEDIATE transactions."""
    if on_postgres():
        pytest.skip("the PostgreSQL version above uses row locks")
    task = started(parent)
    results = finalizers(task, 8)
    assert results.count(True) == 1, results
    assert Wakeup.objects.count() == 1


@pytest.mark.postgres
def test_a_deadlock_victim_is_run_again_by_the_store(user):
    """Two writers lock two conversations in opposite orders: PostgreSQL rolls one back as the
    deadlock's victim, and `retried` runs it again, so both succeed."""
    first = store.create_conversation(owner=user, agent="echo").id
    second = store.create_conversation(owner=user, agent="echo").id
    both_hold_one = threading.Barrier(2)
    attempts: list[str] = []

    @retried
    def lock_both(i):
        mine, theirs = (first, second) if i == 0 else (second, first)
        attempts.append(mine)
        with transaction.atomic():
            store.lock_conversation(mine)
            if attempts.count(mine) == 1:
                both_hold_one.wait(5)  # the first time, each holds one before it asks for the other
            store.lock_conversation(theirs)
        return "done"

    assert run_threads(lock_both, 2) == ["done", "done"]
    assert len(attempts) == 3  # one of the two ran twice


@pytest.mark.postgres
def test_a_deadlock_inside_a_callers_transaction_is_left_to_the_caller(user):
    first = store.create_conversation(owner=user, agent="echo").id
    second = store.create_conversation(owner=user, agent="echo").id
    both_hold_one = threading.Barrier(2)

    @retried
    def lock_other(theirs):
        store.lock_conversation(theirs)

    def caller(i):
        mine, theirs = (first, second) if i == 0 else (second, first)
        with transaction.atomic():
            store.lock_conversation(mine)
            both_hold_one.wait(5)
            lock_other(theirs)
        return "done"

    results = run_threads(caller, 2)
    # The victim's whole transaction was lost: not run again inside it, the error reaches it.
    assert sorted(type(r).__name__ for r in results) == ["OperationalError", "str"]
