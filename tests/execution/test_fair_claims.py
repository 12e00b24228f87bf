"""What the claims take first: due runs only, wake-ups, owners in turn, priorities (both
databases: agenttasks_claim_runs_v8 on PostgreSQL, store.claims.fair_order elsewhere)."""

from collections import Counter
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from agenttasks import lifecycle, store
from agenttasks.exceptions import TaskNotFound
from agenttasks.execution import worker
from agenttasks.models import Run, Task
from agenttasks.runtime import task_tools
from agenttasks.types import Ending, NewTask, RunOutcome

from ..conftest import run_threads
from ..factories import ConversationFactory, RunFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def create(owner, n=1, **fields):
    return [
        store.create_task(
            NewTask(owner=owner, agent="echo", input=f"{owner.username} {i}", **fields)
        )
        for i in range(n)
    ]


def claimed(limit, **kw):
    return [run.id for run in store.claim_many("host:1", limit, **kw).runs]


def test_a_delayed_run_waits_for_its_time_and_the_claim_says_when(user):
    later = timezone.now() + timedelta(minutes=5)
    (task,) = create(user, not_before=later)
    answer = store.claim_many("host:1", 10, first=[task.run_id])
    assert answer.runs == [] and answer.next_at == later
    worker.execute_run(task.run_id)  # a job outside a worker's slots leaves it too
    assert Run.objects.get(pk=task.run_id).status == "queued"
    Run.objects.filter(pk=task.run_id).update(not_before=timezone.now() - timedelta(seconds=1))
    answer = store.claim_many("host:1", 10)
    assert [r.id for r in answer.runs] == [task.run_id] and answer.next_at is None


def test_a_start_time_already_past_starts_now(user):
    (task,) = create(user, not_before=timezone.now() - timedelta(hours=1))
    assert Run.objects.get(pk=task.run_id).not_before is None
    assert claimed(10) == [task.run_id]


def test_owners_take_turns(user):
    other = UserFactory(username="b")
    burst = create(user, 5)
    late = create(other, 2)
    order = claimed(4)
    assert order == [burst[0].run_id, late[0].run_id, burst[1].run_id, late[1].run_id]


def test_a_higher_priority_goes_first_within_its_owners_share(user):
    other = UserFactory(username="b")
    backlog = create(user, 3)
    theirs = create(other, 1)
    (urgent,) = create(user, priority=10)
    order = claimed(5)
    assert order[:2] == [urgent.run_id, theirs[0].run_id]  # both first in their owner's share
    assert order[2:] == [t.run_id for t in backlog]


def test_wakeups_go_before_new_work(user):
    backlog = create(user, 3)
    wake = RunFactory(conversation=ConversationFactory(owner=user), trigger="wakeup")
    assert claimed(2) == [wake.id, backlog[0].run_id]


def test_a_priority_set_later_moves_the_task_up(user):
    backlog = create(user, 3)
    lifecycle.set_priority(backlog[2].id, 5)
    assert claimed(1) == [backlog[2].run_id]


@pytest.mark.parametrize("priority", [101, -101, 1.5, True, "1"])
def test_a_bad_priority_is_refused(user, priority):
    (task,) = create(user)
    with pytest.raises(ValueError, match="priority must be an integer from -100 to 100"):
        lifecycle.set_priority(task.id, priority)


def test_the_priority_of_an_unknown_task_is_not_found():
    with pytest.raises(TaskNotFound):
        lifecycle.set_priority("task_missing", 1)


@override_settings(AGENTTASKS={"MAX_DEPTH": 2})
def test_a_spawned_task_takes_its_spawners_priority_unless_the_caller_gives_one(user):
    urgent = lifecycle.create(owner=user, agent_id="echo", input="urgent", priority=40)
    child = lifecycle.spawn(urgent.conversation_id, "echo", "a step of it")
    assert Task.objects.get(pk=child.task_id).priority == 40
    spawn = task_tools.spawn_tool(urgent.conversation_id, priority=-5)
    result = spawn.call({"agent_name": "echo", "input": "a chore", "label": ""})
    assert not result.is_error, result
    chore = Task.objects.filter(parent_conversation_id=urgent.conversation_id).exclude(
        pk=child.task_id
    )
    assert [t.priority for t in chore] == [-5]
    with pytest.raises(ValueError, match="priority must be an integer from -100 to 100"):
        task_tools.task_tools(urgent.conversation_id, priority=500)


@override_settings(AGENTTASKS={"MAX_RUNNING_PER_USER": 2})
def test_an_owner_at_the_running_limit_waits_while_others_go_on(user):
    other = UserFactory(username="b")
    burst = create(user, 5)
    theirs = create(other, 3)
    first = claimed(10)
    assert sorted(first) == sorted([t.run_id for t in burst[:2] + theirs[:2]])  # two each
    assert claimed(10) == []  # both at their limit: the rest stay queued
    done = RunOutcome(burst[0].run_id, "completed", text="done")
    store.end(burst[0].id, burst[0].run_id, Ending("completed"), outcome=done)
    assert claimed(10) == [burst[2].run_id]  # one ended: the owner's next one goes
    assert Run.objects.filter(status="queued").count() == 3


@override_settings(AGENTTASKS={"MAX_RUNNING_PER_USER": 1})
def test_claimers_racing_never_let_an_owner_past_the_running_limit():
    """Eight processes' claims at once (threads with their own connections), over the queues of
    many owners: a claim that passes over the runs another claim holds must not take those
    owners' next runs beside them."""
    owners = [UserFactory(username=f"owner{i}") for i in range(40)]
    for owner in owners:
        create(owner, 3)
    for _ in range(3):
        made = run_threads(lambda i: claimed(6), 8)
        assert all(isinstance(ids, list) for ids in made), made
        running = Run.objects.filter(status="running")
        by_owner = Counter(run.conversation.owner_id for run in running)
        assert by_owner and max(by_owner.values()) == 1, by_owner
        for run in running:  # end them: the next round races for the owners' next runs
            outcome = RunOutcome(run.id, "completed", text="done")
            store.end(run.task_id, run.id, Ending("completed"), outcome=outcome)


@override_settings(AGENTTASKS={"MAX_RUNNING_PER_USER": 1})
def test_runs_without_a_task_are_not_held_back_by_the_running_limit(user):
    (task,) = create(user)
    assert claimed(10) == [task.run_id]
    wake = RunFactory(conversation=ConversationFactory(owner=user), trigger="wakeup")
    assert claimed(10) == [wake.id]


def test_an_agent_whose_line_is_full_is_left_queued_while_others_go_on(user):
    other = UserFactory(username="b")
    chatty = create(user, 3)
    quiet = [
        store.create_task(NewTask(owner=other, agent="worker", input=f"w {i}")) for i in range(2)
    ]
    answer = store.claim_many("host:1", 10, agent_room={"echo": 1})
    assert sorted(r.id for r in answer.runs) == sorted(
        [chatty[0].run_id, quiet[0].run_id, quiet[1].run_id]
    )
    assert store.claim_many("host:1", 10, agent_room={"echo": 0}).runs == []
    assert claimed(10) == [chatty[1].run_id, chatty[2].run_id]  # room again: in their order


def test_an_owners_runs_behind_a_full_line_are_still_found(user):
    """More of the owner's runs than a claim looks at first are of an agent without room: the
    claim looks further, to the run of another agent behind them."""
    full = create(user, 12)
    (behind,) = [store.create_task(NewTask(owner=user, agent="worker", input="behind"))]
    assert claimed(10, agent_room={"echo": 0}) == [behind.run_id]
    assert claimed(1) == [full[0].run_id]


@override_settings(AGENTTASKS={"MAX_RUNNING_PER_USER": 1})
def test_an_owners_message_behind_many_held_back_tasks_still_goes(user):
    first, *held = create(user, 12)
    assert claimed(10) == [first.run_id]
    message = RunFactory(conversation=ConversationFactory(owner=user))
    assert claimed(10) == [message.id]
    assert Run.objects.filter(pk__in=[t.run_id for t in held], status="queued").count() == 11


def test_a_run_carries_its_owner_and_its_tasks_priority(user):
    (task,) = create(user, priority=7)
    run = Run.objects.get(pk=task.run_id)
    assert (run.owner_id, run.priority) == (user.pk, 7)
    lifecycle.set_priority(task.id, -3)
    assert Run.objects.get(pk=task.run_id).priority == -3
