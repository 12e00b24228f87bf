"""Settings defaults, the numeric rule, hooks and environment fallbacks; system checks; ids."""

import re

import pytest
from django.core.management import call_command
from django.test.utils import override_settings

from agenttasks import ids
from agenttasks.checks import check_cluster, check_settings
from agenttasks.conf import NUMERIC_DEFAULTS, app_settings


def test_defaults():
    assert app_settings.SUMMARY_LIMIT == 300
    assert app_settings.MAX_ATTEMPTS == 3
    assert app_settings.MAX_CONCURRENT_PER_PARENT == 6
    assert app_settings.MAX_ACTIVE_TASKS_PER_USER == 20
    assert app_settings.FILES["maxCount"] == 10


@pytest.mark.parametrize("key", sorted(NUMERIC_DEFAULTS))
@pytest.mark.parametrize("value", [0, -1, None, "7"])
def test_numeric_setting_at_or_below_zero_reads_as_default(key, value):
    # lifecycle 7.9.16; SCHEDULER_INTERVAL 0 is a choice: leave the scheduler to django-q2
    expected = 0.0 if (key, value) == ("SCHEDULER_INTERVAL", 0) else NUMERIC_DEFAULTS[key]
    with override_settings(AGENTTASKS={key: value}):
        assert getattr(app_settings, key) == expected


@pytest.mark.parametrize("timeout", [None, 0, -5, "soon"])
def test_every_approval_lapses_after_60_minutes_by_default(timeout):
    # DEFAULT_HITL: 60 minutes, and no setting makes an action that never lapses.
    assert app_settings.DEFAULT_HITL == {"timeout_minutes": 60, "on_timeout": "deny"}
    with override_settings(AGENTTASKS={"DEFAULT_HITL": {"timeout_minutes": timeout}}):
        assert app_settings.DEFAULT_HITL == {"timeout_minutes": 60, "on_timeout": "deny"}
        # The deadline every action gets (REST's expiresAt), even from an unvalidated AgentDef.
        from datetime import timedelta

        from django.utils import timezone

        from agenttasks.registry import AgentDef
        from agenttasks.runtime.base import RunContext

        agent = AgentDef(id="raw", hitl={"timeout_minutes": timeout})
        ctx = RunContext(run=None, conversation=None, task=None, agent=agent, stop=None)
        deadline = ctx._deadline()["deadline"]
        assert abs(deadline - timezone.now() - timedelta(minutes=60)) < timedelta(seconds=5)


def test_an_agent_cannot_ask_for_an_approval_that_never_lapses():
    from django.core.exceptions import ImproperlyConfigured

    from agenttasks import registry

    with pytest.raises(ImproperlyConfigured, match="timeout_minutes has an invalid value None"):
        registry.build("forever", hitl={"timeout_minutes": None})
    assert registry.build("soon", hitl={"timeout_minutes": 0.5}).hitl["timeout_minutes"] == 0.5


def test_overrides_are_read_again():
    with override_settings(AGENTTASKS={"SUMMARY_LIMIT": 12, "MAX_ACTIVE_TASKS_PER_USER": 0}):
        assert app_settings.SUMMARY_LIMIT == 12
        assert app_settings.MAX_ACTIVE_TASKS_PER_USER == 0  # 0 = no limit
    assert app_settings.SUMMARY_LIMIT == 300


def cap():
    return 4


def test_cap_may_be_a_callable_path():
    with override_settings(AGENTTASKS={"MAX_CONCURRENT_PER_PARENT": "tests.test_conf.cap"}):
        assert app_settings.MAX_CONCURRENT_PER_PARENT == 4


def test_environment_fallback_read_when_needed(monkeypatch):
    monkeypatch.setenv("AGENTTASKS_MODEL_BASE_URL", "http://127.0.0.1:9/v1")
    with override_settings(AGENTTASKS={}):
        assert app_settings.MODEL_BASE_URL == "http://127.0.0.1:9/v1"
    with override_settings(AGENTTASKS={"MODEL_BASE_URL": "http://x/v1"}):
        assert app_settings.MODEL_BASE_URL == "http://x/v1"


def test_unknown_key_and_bad_hook_are_reported():
    with override_settings(
        AGENTTASKS={"MAX_ATTEMPTS_PER_TASK": 3, "CONTINUE": {"k": "no.such.hook"}}
    ):
        ids_ = [m.id for m in check_settings()]
    assert "agenttasks.W001" in ids_ and "agenttasks.E003" in ids_


def test_lease_close_to_heartbeat_is_warned():
    with override_settings(AGENTTASKS={"LEASE_TIMEOUT": 10, "HEARTBEAT_INTERVAL": 5}):
        assert "agenttasks.W002" in [m.id for m in check_settings()]


def test_cluster_retry_not_above_timeout_is_warned():
    with override_settings(Q_CLUSTER={"timeout": 60, "retry": 60}):
        assert [m.id for m in check_cluster()] == ["agenttasks.W007"]
    with override_settings(Q_CLUSTER={"timeout": 60, "retry": 90}):
        assert check_cluster() == []


def test_the_demo_site_passes_its_checks():
    call_command("check", fail_level="ERROR")


def test_ids_have_prefix_and_21_url_safe_characters():
    for make, prefix in [
        (ids.new_task_id, "task_"),
        (ids.new_run_id, "run_"),
        (ids.new_conversation_id, "conv_"),
        (ids.new_event_id, "evt_"),
    ]:
        value = make()
        assert re.fullmatch(re.escape(prefix) + r"[A-Za-z0-9_-]{21}", value)
    assert len({ids.new_task_id() for _ in range(1000)}) == 1000


def test_a_plain_check_warns_of_sqlite_without_immediate_with_the_whole_options(tmp_path):
    """W008 needed `check --database default`; it reads only the settings, so a plain check."""
    import os
    import subprocess
    import sys

    from .cluster import ROOT

    (tmp_path / "loose_settings.py").write_text(
        "from project.settings import *  # noqa: F403\n"
        'DATABASES["default"]["OPTIONS"] = {}  # noqa: F405\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {
        "DJANGO_SETTINGS_MODULE": "loose_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "SQLITE_PATH": str(tmp_path / "loose.sqlite3"),
    }
    checked = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    assert (
        "?: (agenttasks.W008) Database 'default' is SQLite without transaction_mode IMMEDIATE."
        in checked.stderr
    )
    assert (
        'HINT: Set "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20, '
        '"init_command": "PRAGMA journal_mode=WAL;"}'
    ) in checked.stderr


def test_tracing_without_the_otel_extra_fails_a_check(settings, monkeypatch):
    from agenttasks import checks, tracing

    monkeypatch.setattr(tracing, "REQUIRED", ("opentelemetry.sdk", "no_such_otel_module"))
    assert checks.check_tracing() == []  # off: nothing is needed
    settings.AGENTTASKS = {**settings.AGENTTASKS, "TRACING": True}
    (error,) = checks.check_tracing()
    assert error.id == "agenttasks.E008" and "no_such_otel_module" in error.msg
