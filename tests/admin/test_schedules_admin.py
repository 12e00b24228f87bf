"""The schedule admin: the list and its filters, the read-only page with its recent ticks, pause,
resume and run now through the lifecycle, and delete taking django-q2's row with it."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule as QSchedule

from agenttasks import registry
from agenttasks.admin import schedules as schedule_admin
from agenttasks.lifecycle import schedules
from agenttasks.models import Schedule, ScheduleTick, Task

from .test_admin import said, staff, url

pytestmark = pytest.mark.django_db


def every(user, seconds=60, **kwargs):
    return schedules.create_schedule(
        owner=user, agent_id="worker", input="summarise", interval=seconds, **kwargs
    )


def daily(user, **kwargs):
    return schedules.create_schedule(
        owner=user,
        agent_id="default",
        input="digest",
        cron="0 9 * * *",
        timezone="Europe/Paris",
        **kwargs,
    )


def act(client, action, *selected):
    data = {"action": action, "_selected_action": [s.pk for s in selected], "index": 0}
    return client.post(url("schedule_changelist"), data)


@pytest.fixture
def viewer(client):
    client.force_login(staff("viewer", "view_schedule"))
    return client


# --- the list ----------------------------------------------------------------------------------


def test_changelist_shows_the_clock_status_and_runs(admin_client, admin_user):
    ticking = every(admin_user, label="hourly check")
    paused = daily(admin_user, label="morning digest", paused=True)
    response = admin_client.get(url("schedule_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    for schedule in (ticking, paused):
        assert url("schedule_change", schedule.pk) in html and schedule.pk in html
    assert "hourly check" in html and "morning digest" in html
    assert "every 60 s (UTC)" in html and "0 9 * * * (Europe/Paris)" in html
    assert "at-status-running" in html and ">active<" in html and ">paused<" in html
    rows = {s.pk: s for s in response.context["cl"].result_list}
    assert rows[ticking.pk].next_run_at is not None and rows[paused.pk].next_run_at is None
    assert 'value="pause"' in html and 'value="run_now"' in html  # the actions offered
    assert url("schedule_add") not in html


@pytest.mark.parametrize(
    "query, expected",
    [
        ("paused=yes", ["digest"]),
        ("paused=no", ["check"]),
        ("agent=worker", ["check"]),
        ("agent=default", ["digest"]),
        ("q=digest", ["digest"]),
        ("q=worker", ["check"]),
    ],
)
def test_changelist_filters_and_search(admin_client, admin_user, query, expected):
    found = {
        "check": every(admin_user, label="check"),
        "digest": daily(admin_user, label="digest", paused=True),
    }
    response = admin_client.get(url("schedule_changelist") + "?" + query)
    assert response.status_code == 200
    listed = [s.pk for s in response.context["cl"].result_list]
    assert listed == [found[name].pk for name in expected]


def test_changelist_search_by_id(admin_client, admin_user):
    one, other = every(admin_user), every(admin_user)
    response = admin_client.get(url("schedule_changelist") + f"?q={one.pk}")
    assert [s.pk for s in response.context["cl"].result_list] == [one.pk]
    assert other.pk not in [s.pk for s in response.context["cl"].result_list]


def test_changelist_queries_do_not_grow_with_the_rows(admin_client, admin_user):
    every(admin_user)
    admin_client.get(url("schedule_changelist"))  # the first request loads what it caches
    with CaptureQueriesContext(connection) as few:
        admin_client.get(url("schedule_changelist"))
    for _ in range(5):
        daily(admin_user)
    with CaptureQueriesContext(connection) as many:
        admin_client.get(url("schedule_changelist"))
    assert len(many) == len(few)


# --- the page and its ticks --------------------------------------------------------------------


def test_the_page_is_read_only_and_shows_the_recent_ticks(admin_client, admin_user):
    schedule = every(admin_user, label="hourly check", metadata={"team": "a"})
    tick = schedules.run_now(schedule.pk)
    response = admin_client.get(url("schedule_change", schedule.pk))
    assert response.status_code == 200
    html = response.content.decode()
    assert "hourly check" in html and "every 60 s (UTC)" in html and "creates a task" in html
    assert "&quot;team&quot;: &quot;a&quot;" in html
    assert "created a task" in html and url("task_change", tick.task_id) in html
    assert reverse("admin:django_q_schedule_change", args=[schedule.q_schedule_id]) in html
    assert 'name="_save"' not in html
    (ticks,) = response.context["inline_admin_formsets"]
    assert [form.instance.pk for form in ticks.formset.forms] == [tick.pk]


def test_the_page_shows_only_the_newest_ticks(admin_client, admin_user, monkeypatch):
    monkeypatch.setattr(schedule_admin, "RECENT_TICKS", 2)
    schedule = every(admin_user)
    now = timezone.now()
    for minutes in (3, 2, 1):
        schedules.fire(schedule.pk, due=(now - timedelta(minutes=minutes)).isoformat())
    response = admin_client.get(url("schedule_change", schedule.pk))
    (ticks,) = response.context["inline_admin_formsets"]
    shown = [form.instance.due_at for form in ticks.formset.forms]
    assert shown == [now - timedelta(minutes=1), now - timedelta(minutes=2)]
    assert ScheduleTick.objects.filter(schedule=schedule).count() == 3


def test_a_viewer_sees_the_page_and_its_ticks_but_no_actions(viewer, admin_user):
    schedule = every(admin_user)
    tick = schedules.run_now(schedule.pk)
    page = viewer.get(url("schedule_change", schedule.pk))
    assert page.status_code == 200
    assert url("task_change", tick.task_id) in page.content.decode()
    assert b"deletelink" not in page.content
    changelist = viewer.get(url("schedule_changelist")).content.decode()
    assert 'value="run_now"' not in changelist and 'value="pause"' not in changelist
    response = act(viewer, "pause", schedule)
    assert response.status_code == 200  # the changelist again: the action is not offered
    assert not Schedule.objects.get(pk=schedule.pk).paused
    assert viewer.get(url("schedule_add")).status_code == 403
    assert viewer.get(url("schedule_delete", schedule.pk)).status_code == 403


def test_nothing_is_added_or_edited_by_hand(admin_client, admin_user):
    schedule = every(admin_user)
    assert admin_client.get(url("schedule_add")).status_code == 403
    response = admin_client.post(url("schedule_change", schedule.pk), {"input": "changed"})
    assert response.status_code == 403
    assert Schedule.objects.get(pk=schedule.pk).input == "summarise"


# --- actions -----------------------------------------------------------------------------------


def test_pause_and_resume(admin_client, admin_user):
    one, two = every(admin_user), every(admin_user)
    response = act(admin_client, "pause", one, two)
    assert response.status_code == 302
    assert said(response) == ["Pause: 2 paused."]
    assert all(s.paused and s.next_run_at is None for s in Schedule.objects.all())
    assert set(QSchedule.objects.values_list("repeats", flat=True)) == {0}
    schedules.resume_schedule(two.pk)
    assert said(act(admin_client, "pause", one, two)) == ["Pause: 1 paused, 1 already paused."]
    assert said(act(admin_client, "resume", one)) == ["Resume: 1 resumed."]
    resumed = Schedule.objects.get(pk=one.pk)
    assert not resumed.paused and resumed.next_run_at > timezone.now()
    assert QSchedule.objects.get(pk=one.q_schedule_id).repeats == 1
    assert said(act(admin_client, "resume", one)) == ["Resume: 1 already active."]


def test_run_now_creates_a_task_of_the_schedule(admin_client, admin_user):
    schedule = every(admin_user, label="hourly check")
    paused = daily(admin_user, paused=True)
    response = act(admin_client, "run_now", schedule, paused)
    assert response.status_code == 302
    assert said(response) == ["Run now: 2 created a task."]
    task = Task.objects.get(schedule_id=schedule.pk)
    assert (task.agent, task.input, task.label, task.owner) == (
        "worker",
        "summarise",
        "hourly check",
        admin_user,
    )
    assert Task.objects.get(schedule_id=paused.pk).agent == "default"
    tick = ScheduleTick.objects.get(schedule=schedule)
    assert tick.task_id == task.pk and tick.outcome == "created"
    assert Schedule.objects.get(pk=paused.pk).paused  # run now does not resume it


def test_run_now_reports_a_refused_tick(admin_client, admin_user):
    registry.register("short-lived", runtime="callable", handler=lambda ctx: None)
    try:
        schedule = schedules.create_schedule(
            owner=admin_user, agent_id="short-lived", input="x", interval=60
        )
    finally:
        registry.unregister("short-lived")
    ok = every(admin_user)
    response = act(admin_client, "run_now", schedule, ok)
    assert said(response) == ["Run now: 1 created a task, 1 refused: unknown_agent."]
    assert not Task.objects.filter(schedule_id=schedule.pk).exists()
    assert ScheduleTick.objects.get(schedule=schedule).outcome == "refused"


def test_a_broken_schedule_does_not_hide_the_others(admin_client, admin_user, monkeypatch):
    one, two = every(admin_user), every(admin_user)
    real = schedules.pause_schedule

    def pause(schedule_id):
        if schedule_id == one.pk:
            raise RuntimeError("boom")
        return real(schedule_id)

    monkeypatch.setattr(schedules, "pause_schedule", pause)
    response = act(admin_client, "pause", one, two)
    assert said(response) == ["Pause: 1 paused, 1 failed with an error (see the server log)."]
    assert Schedule.objects.get(pk=two.pk).paused and not Schedule.objects.get(pk=one.pk).paused


# --- delete ------------------------------------------------------------------------------------


def test_delete_goes_through_the_lifecycle_and_takes_django_q2s_row(admin_client, admin_user):
    schedule = every(admin_user, label="hourly check")
    tick = schedules.run_now(schedule.pk)
    q_id = schedule.q_schedule_id
    page = admin_client.get(url("schedule_delete", schedule.pk))
    assert page.status_code == 200
    html = page.content.decode()
    assert "hourly check" in html and "1 tick" in html
    response = admin_client.post(url("schedule_delete", schedule.pk), {"post": "yes"})
    assert response.status_code == 302
    assert not Schedule.objects.filter(pk=schedule.pk).exists()
    assert not QSchedule.objects.filter(pk=q_id).exists()
    assert not ScheduleTick.objects.exists()
    assert Task.objects.get(pk=tick.task_id).schedule_id is None  # its tasks stay, without it


def test_bulk_delete(admin_client, admin_user):
    selected = [every(admin_user), daily(admin_user), daily(admin_user, paused=True)]
    kept = every(admin_user)
    data = {"action": "delete_selected", "_selected_action": [s.pk for s in selected]}
    confirm = admin_client.post(url("schedule_changelist"), {**data, "index": 0})
    assert confirm.status_code == 200 and "Schedules: 3" in confirm.content.decode()
    response = admin_client.post(url("schedule_changelist"), {**data, "post": "yes"})
    assert response.status_code == 302
    assert list(Schedule.objects.values_list("pk", flat=True)) == [kept.pk]
    assert list(QSchedule.objects.values_list("pk", flat=True)) == [kept.q_schedule_id]
