"""Shared pieces of the operator admin: read-only base class, badges, links, durations."""

import json
from datetime import timedelta

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from ..conf import app_settings
from ..states import RunStatus, TaskKind

CSS = {"all": ["agenttasks/admin.css"]}
DELEGATE = TaskKind.DELEGATE


class ReadOnlyAdmin(admin.ModelAdmin):
    """Let operators look, never add, edit or delete by hand."""

    class Media:
        css = CSS

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def badge(status: str, label: str | None = None):
    """Render a status as a coloured badge."""
    return format_html(
        '<span class="at-badge at-status-{}">{}</span>', status or "none", label or status or "—"
    )


def admin_url(model_name: str, object_id, view: str = "change") -> str:
    """Return the admin URL of one agenttasks object."""
    return reverse(f"admin:agenttasks_{model_name}_{view}", args=[quote(object_id)])


def link(model_name: str, object_id, text=None):
    """Link to an object's admin page, or '—' when there is none."""
    if not object_id:
        return "—"
    return format_html('<a href="{}">{}</a>', admin_url(model_name, object_id), text or object_id)


def seconds_between(start, end=None) -> float | None:
    """Return the seconds from start to end (now when end is None), or None without a start."""
    if start is None:
        return None
    return ((end or timezone.now()) - start).total_seconds()


def human_duration(seconds: float | None) -> str:
    """Format seconds as '850 ms', '12.4 s', '3 min 05 s' or '2 h 10 min'."""
    if seconds is None:
        return "—"
    seconds = max(seconds, 0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    return f"{hours // 24} d {hours % 24} h"


def _local(value):
    """An instant in the current time zone (as it is where the site keeps naive datetimes)."""
    return timezone.localtime(value) if timezone.is_aware(value) else value


def when(value, now=None):
    """Render an instant on one line: 'Dec 4, 14:03:21' this year, 'Dec 4 2025, 14:03' before;
    the full timestamp is the title (hover) and the element's datetime. '—' for none."""
    if value is None:
        return "—"
    local, now = _local(value), _local(now or timezone.now())
    shown = "M j, H:i:s" if local.year == now.year else "M j Y, H:i"
    return format_html(
        '<time class="at-date" datetime="{}" title="{}">{}</time>',
        local.isoformat(timespec="seconds"),
        dateformat.format(local, "Y-m-d H:i:s T" if timezone.is_aware(local) else "Y-m-d H:i:s"),
        dateformat.format(local, shown),
    )


def ago(value, now=None):
    """Say how long ago an instant was, in its largest unit ('3 hours ago'); under a minute (or
    ahead of this clock) 'just now', where Django's timesince says '0 minutes'."""
    if value is None:
        return "—"
    now = now or timezone.now()
    if (now - value).total_seconds() < 60:
        text = "just now"
    else:
        text = f"{timesince(value, now, depth=1)} ago"
    return format_html('<span title="{}">{}</span>', value.isoformat(timespec="seconds"), text)


def pretty_json(value) -> str:
    """Indent a JSON value for a <pre> block."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def lease_cutoff():
    """Return the instant before which a running run's last heartbeat means it is dead."""
    return timezone.now() - timedelta(seconds=app_settings.LEASE_TIMEOUT)


def lease(run) -> str:
    """Say whether a running run's lease is alive or stale ('' for other runs)."""
    if run.status != RunStatus.RUNNING:
        return ""
    seen = run.heartbeat_at or run.started_at
    return "alive" if seen is not None and seen > lease_cutoff() else "stale"


def origin(task) -> str:
    """Say where a task came from: top-level (REST or site code), spawned, or delegate."""
    if task.kind == DELEGATE:
        return "delegate"
    return "spawned" if task.parent_conversation_id else "top-level"


def usage_text(usage: dict | None) -> str:
    """Render a Usage object as 'in 12 · out 30 · total 42 tokens'."""
    if not usage:
        return ""
    return "in {} · out {} · total {} tokens".format(
        usage.get("inputTokens", 0), usage.get("outputTokens", 0), usage.get("totalTokens", 0)
    )


def run_rows(runs) -> list[dict]:
    """Return runs with their dates, duration, lease and usage, ready for the runs table."""
    now = timezone.now()
    return [
        {
            "run": run,
            "started": when(run.started_at, now),
            "heartbeat": when(run.heartbeat_at, now),
            "ended": when(run.ended_at, now),
            "duration": human_duration(seconds_between(run.started_at, run.ended_at)),
            "lease": lease(run),
            "usage": usage_text(run.usage),
        }
        for run in runs
    ]


def total_usage(runs) -> str:
    """Add up the usage of the runs that know theirs."""
    usages = [run.usage for run in runs if run.usage]
    if not usages:
        return ""
    keys = ("inputTokens", "outputTokens", "totalTokens")
    return usage_text({key: sum(u[key] for u in usages) for key in keys})


def with_json(actions):
    """Attach what the templates show of each action: pretty JSON of its arguments and
    resolution, and its dates (asked, decided, expires) on one line each."""
    now = timezone.now()
    for action in actions:
        action.asked = when(action.created_at, now)
        action.decided = when(action.decided_at, now)
        action.expires = when(action.deadline, now)
        action.args_json = pretty_json(action.args) if action.args else ""
        action.resolution_json = pretty_json(action.resolution) if action.resolution else ""
    return actions
