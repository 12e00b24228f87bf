"""Schedules (docs/lifecycle.md#schedules): the clock, the checks, one task per tick, pause and
resume, missed ticks, posting into a conversation, and django-q2's scheduler firing and re-arming
a schedule's row in one transaction."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ
from django_q.models import Schedule as QSchedule

from agenttasks import lifecycle
from agenttasks.broker import queue
from agenttasks.compat import django_q
from agenttasks.exceptions import ConversationNotFound, InvalidSchedule
from agenttasks.lifecycle import schedules
from agenttasks.models import Schedule, ScheduleTick, Task
from agenttasks.states import TickOutcome

from ..factories import UserFactory

pytestmark = pytest.mark.django_db


def every(user, seconds=60, **kwargs):
    return schedules.create_schedule(
        owner=user, agent_id="worker", input="summarise", interval=seconds, **kwargs
    )


def test_a_cron_expression_is_read_in_the_schedules_time_zone_across_daylight_saving(user):
    schedule = schedules.create_schedule(
        owner=user, agent_id="worker", input="x", cron="0 9 * * *", timezone="Europe/Paris"
    )
    before_the_change = datetime(2026, 3, 28, 12, tzinfo=UTC)
    assert schedules.next_tick(schedule, before_the_change) == datetime(2026, 3, 29, 7, tzinfo=UTC)
    after_it = datetime(2026, 3, 29, 12, tzinfo=UTC)
    assert schedules.next_tick(schedule, after_it) == datetime(2026, 3, 30, 7, tzinfo=UTC)


def test_an_interval_counts_from_the_schedules_creation(user):
    schedule = every(user, seconds=7)
    anchor = schedule.created_at
    assert schedules.next_tick(schedule, anchor) == anchor + timedelta(seconds=7)
    assert schedules.next_tick(schedule, anchor + timedelta(seconds=15)) == anchor + timedelta(
        seconds=21
    )


def test_a_six_field_cron_ticks_by_the_second(user):
    schedule = schedules.create_schedule(
        owner=user, agent_id="worker", input="x", cron="* * * * * */2"
    )
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert schedules.next_tick(schedule, start) == start + timedelta(seconds=2)


@pytest.mark.parametrize(
    "clock, field, message",
    [
        ({"cron": "61 * * * *"}, "cron", "Invalid cron expression: '61 * * * *'"),
        ({"cron": "0 0 30 2 *"}, "cron", "Invalid cron expression: '0 0 30 2 *'"),
        ({"cron": "0 9 * * *", "interval": 60}, "cron", "Give either cron or intervalSeconds"),
        ({}, "cron", "Give either cron or intervalSeconds"),
        (
            {"interval": 0},
            "intervalSeconds",
            "intervalSeconds must be a whole number from 1 to 31622400",
        ),
        ({"interval": 10**9}, "intervalSeconds", "intervalSeconds must be a whole number"),
        ({"interval": 60, "timezone": "Mars/Olympus"}, "timezone", "Unknown time zone"),
        ({"interval": 60, "timezone": "x" * 300}, "timezone", "Unknown time zone"),
        ({"interval": 60, "strategy": "sideways"}, "multitaskStrategy", "multitaskStrategy must"),
        ({"interval": 60, "missed": "never"}, "missedTicks", "missedTicks must be one of"),
        ({"interval": 60, "agent_id": "nobody"}, "agentId", "Unknown agent: 'nobody'"),
    ],
)
def test_a_schedule_that_cannot_tick_is_refused_and_nothing_is_written(user, clock, field, message):
    clock = {"agent_id": "worker", **clock}
    with pytest.raises(InvalidSchedule) as refused:
        schedules.create_schedule(owner=user, input="x", **clock)
    assert refused.value.field == field
    assert str(refused.value).startswith(message)
    assert not Schedule.objects.exists() and not QSchedule.objects.exists()


def test_a_new_schedule_arms_one_django_q2_row_for_its_next_tick(user):
    schedule = every(user)
    row = QSchedule.objects.get(pk=schedule.q_schedule_id)
    assert (row.func, row.repeats, row.schedule_type) == (schedules.FIRE, 1, QSchedule.ONCE)
    assert row.next_run == schedule.next_run_at == schedule.created_at + timedelta(seconds=60)
    assert row.intended_date_kwarg == "due"


def test_a_tick_acts_once_whatever_delivered_it_twice(user):
    schedule = every(user, label="daily digest", metadata={"team": "a"})
    due = timezone.now().isoformat()
    first = schedules.fire(schedule.id, due=due)
    again = schedules.fire(schedule.id, due=due)
    assert first.outcome == TickOutcome.CREATED and again.pk == first.pk
    task = Task.objects.get(schedule=schedule)
    assert (task.agent, task.input, task.label, task.metadata) == (
        "worker",
        "summarise",
        "daily digest",
        {"team": "a"},
    )
    assert first.task_id == task.id
    assert Schedule.objects.get(pk=schedule.pk).last_run_at == datetime.fromisoformat(due)


def test_a_missed_tick_is_skipped_or_run_once_late_as_the_schedule_says(user):
    long_ago = (timezone.now() - timedelta(hours=1)).isoformat()
    skipping = every(user, missed="skip")
    assert schedules.fire(skipping.id, due=long_ago).outcome == TickOutcome.SKIPPED
    assert not Task.objects.filter(schedule=skipping).exists()
    late = every(user, missed="run_late")
    assert schedules.fire(late.id, due=long_ago).outcome == TickOutcome.CREATED
    assert Task.objects.filter(schedule=late).count() == 1
    # A tick on time is not missed, whatever the policy.
    on_time = timezone.now().isoformat()
    assert schedules.fire(skipping.id, due=on_time).outcome == TickOutcome.CREATED


def test_pause_disarms_the_row_and_resume_arms_it_from_now(user):
    schedule = every(user)
    paused = schedules.pause_schedule(schedule.id)
    assert paused.paused and paused.next_run_at is None
    assert QSchedule.objects.get(pk=schedule.q_schedule_id).repeats == 0
    assert schedules.fire(schedule.id, due=timezone.now().isoformat()) is None
    assert not Task.objects.exists()
    resumed = schedules.resume_schedule(schedule.id)
    row = QSchedule.objects.get(pk=schedule.q_schedule_id)
    assert not resumed.paused and row.repeats == 1
    assert row.next_run == resumed.next_run_at > timezone.now()


def test_run_now_fires_a_paused_schedule_once(user):
    schedule = every(user, paused=True)
    assert schedule.q_schedule_id is None  # never armed
    tick = schedules.run_now(schedule.id)
    assert tick.outcome == TickOutcome.CREATED
    assert Task.objects.get(schedule=schedule).id == tick.task_id


def test_a_changed_clock_moves_the_next_tick(user):
    schedule = every(user, seconds=3600)
    changed = schedules.update_schedule(schedule.id, cron="*/5 * * * *", timezone="Asia/Tokyo")
    assert (changed.cron, changed.interval) == ("*/5 * * * *", None)
    row = QSchedule.objects.get(pk=schedule.q_schedule_id)
    assert row.next_run == changed.next_run_at <= timezone.now() + timedelta(minutes=5)
    with pytest.raises(InvalidSchedule):
        schedules.update_schedule(schedule.id, timezone="Nowhere/Land")
    assert Schedule.objects.get(pk=schedule.pk).timezone == "Asia/Tokyo"


def test_delete_removes_the_row_and_keeps_the_tasks(user):
    schedule = every(user)
    schedules.run_now(schedule.id)
    q_id = schedule.q_schedule_id
    schedules.delete_schedule(schedule.id)
    assert not QSchedule.objects.filter(pk=q_id).exists()
    assert not ScheduleTick.objects.exists()
    assert Task.objects.get().schedule_id is None


def test_a_schedule_posts_into_a_conversation_and_a_busy_one_refuses_the_tick(user):
    conversation = lifecycle.create_conversation(owner=user, agent_id="default")
    schedule = schedules.create_schedule(
        owner=user, input="good morning", conversation_id=conversation.id, interval=60
    )
    assert schedule.agent == "default"
    posted = schedules.fire(schedule.id, due=timezone.now().isoformat())
    assert posted.outcome == TickOutcome.POSTED and posted.run_id
    # Its run has not ended: the next tick finds the conversation busy (reject).
    busy = schedules.fire(schedule.id, due=(timezone.now() + timedelta(seconds=1)).isoformat())
    assert (busy.outcome, busy.detail) == (TickOutcome.REFUSED, "conversation_busy")


def test_a_schedule_cannot_post_into_someone_elses_conversation(user):
    other = lifecycle.create_conversation(owner=UserFactory(), agent_id="default")
    with pytest.raises(ConversationNotFound):
        schedules.create_schedule(owner=user, input="x", conversation_id=other.id, interval=60)


@pytest.mark.django_db(transaction=True)  # its scheduler closes connections
def test_django_q2s_scheduler_fires_a_due_row_once_and_rearms_it_in_its_transaction(user):
    schedule = every(user, seconds=30)
    due = timezone.now() - timedelta(seconds=1)
    QSchedule.objects.filter(pk=schedule.q_schedule_id).update(next_run=due)
    broker = queue.broker()
    django_q.fire_due_schedules(broker)
    django_q.fire_due_schedules(broker)  # the row moved on: nothing more is due
    row = QSchedule.objects.get(pk=schedule.q_schedule_id)
    assert row.repeats == 1 and row.next_run > timezone.now()
    assert Schedule.objects.get(pk=schedule.pk).next_run_at == row.next_run
    jobs = [job for job in OrmQ.objects.all() if job.func() == schedules.FIRE]
    assert len(jobs) == 1
    assert jobs[0].task["kwargs"]["due"] == due.isoformat()


@pytest.mark.django_db(transaction=True)  # its scheduler closes connections
def test_django_q2s_scheduler_leaves_a_paused_schedule_disarmed(user):
    schedule = every(user, seconds=30)
    QSchedule.objects.filter(pk=schedule.q_schedule_id).update(
        next_run=timezone.now() - timedelta(seconds=1)
    )
    schedules.pause_schedule(schedule.id)
    django_q.fire_due_schedules(queue.broker())
    assert QSchedule.objects.get(pk=schedule.q_schedule_id).repeats == 0
    assert not [job for job in OrmQ.objects.all() if job.func() == schedules.FIRE]
