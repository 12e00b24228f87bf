"""The operator overview: what is running, what failed, stale leases, and a day of endings."""

from datetime import timedelta
from typing import Any

from django.db.models import Count, F, Min, Q
from django.db.models.functions import TruncHour
from django.utils import timezone

from .. import lifecycle
from ..conf import app_settings
from ..flow import budgets
from ..models import PendingAction, ProviderBudget, Run, Task
from ..operations import health
from ..states import TERMINAL, ActionStatus, RunStatus, TaskStatus
from .base import human_duration, lease, lease_cutoff, seconds_between

LIST_LIMIT = 20
HOURS = 24
# The chart stacks terminal statuses bottom-up in this order.
CHART_STATUSES = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)
BAR, GAP, PLOT_HEIGHT, LEFT, TOP = 24, 4, 140, 36, 8


def context(now=None) -> dict:
    """Gather everything the overview page shows."""
    now = now or timezone.now()
    since = now - timedelta(hours=HOURS)
    counts = dict(Task.objects.order_by().values_list("status").annotate(n=Count("id")))
    failed = Task.objects.filter(status=TaskStatus.FAILED, finished_at__gte=since)
    actions = PendingAction.objects.filter(status=ActionStatus.PENDING).aggregate(
        open=Count("id"), overdue=Count("id", filter=Q(deadline__lt=now))
    )
    return {
        "queue": _queue(),
        "status_counts": [(s, TaskStatus(s).label, counts.get(s, 0)) for s in TaskStatus.values],
        "total": sum(counts.values()),
        "running": _running(),
        "running_count": counts.get(TaskStatus.RUNNING, 0),
        "failed_count": failed.count(),
        "failures": [
            (task, human_duration(seconds_between(task.finished_at)))
            for task in failed.order_by("-finished_at")[:LIST_LIMIT]
        ],
        **_runs_to_watch(now),
        **_queue_and_limits(now),
        "open_actions": actions["open"],
        "overdue_actions": actions["overdue"],
        "lease_timeout": app_settings.LEASE_TIMEOUT,
        "chart": chart(now),
    }


def _queue() -> dict:
    """The health check's verdict and details (one statement), with the ages in words."""
    healthy, checked = health.check(details=True)
    details = checked.get("details", {})
    return {
        "healthy": healthy,
        "reasons": checked.get("reasons", []),
        **details,
        "oldest_queued": human_duration((details.get("queue") or {}).get("oldestQueuedAgeSeconds")),
        "last_pass": _age_or_never((details.get("reaper") or {}).get("lastPassAgeSeconds")),
    }


def _running() -> list[dict]:
    """The oldest running tasks, with their progress, lease and heartbeat."""
    running = (
        Task.objects.filter(status=TaskStatus.RUNNING)
        .select_related("run", "owner")
        .order_by("started_at", "id")[:LIST_LIMIT]
    )
    return [
        {
            "task": task,
            "progress": lifecycle.progress_line(task),
            "lease": lease(task.run),
            "heartbeat": human_duration(seconds_between(task.run.heartbeat_at)),
            "running_for": human_duration(seconds_between(task.started_at)),
        }
        for task in running
    ]


def _runs_to_watch(now) -> dict:
    """Runs past their lease, runs queued too long, and the run whose heartbeat is oldest."""
    runs = Run.objects.aggregate(
        stale=Count(
            "id",
            filter=Q(status=RunStatus.RUNNING)
            & (
                Q(heartbeat_at__lt=lease_cutoff())
                | Q(heartbeat_at__isnull=True, started_at__lt=lease_cutoff())
            ),
        ),
        queued_long=Count(
            "id",
            filter=Q(
                status=RunStatus.QUEUED,
                queued_at__lt=now - timedelta(seconds=app_settings.REQUEUE_AFTER),
            ),
        ),
    )
    oldest = (
        Run.objects.filter(status=RunStatus.RUNNING)
        .order_by(F("heartbeat_at").asc(nulls_first=True), "started_at")
        .first()
    )
    return {
        "oldest_run": oldest,
        "oldest_lease": lease(oldest) if oldest else "",
        "oldest_age": human_duration(seconds_between(oldest.heartbeat_at or oldest.started_at))
        if oldest
        else "",
        "stale_runs": runs["stale"],
        "queued_long": runs["queued_long"],
    }


def _age_or_never(seconds: float | None) -> str:
    return "never" if seconds is None else human_duration(seconds)


def chart(now) -> dict:
    """Lay out an SVG bar chart of tasks finished per hour, by status, over the last day."""
    # Hours are cut in the current time zone, as TruncHour cuts them.
    end = timezone.localtime(now).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = end - timedelta(hours=HOURS)
    hours: list[dict[str, Any]] = [
        {"start": start + timedelta(hours=i), "counts": dict.fromkeys(CHART_STATUSES, 0)}
        for i in range(HOURS)
    ]
    rows = (
        Task.objects.filter(finished_at__gte=start, status__in=TERMINAL)
        .annotate(hour=TruncHour("finished_at"))
        .order_by()
        .values_list("hour", "status")
        .annotate(n=Count("id"))
    )
    for hour, status, n in rows:
        index = int((hour - start).total_seconds() // 3600)
        if 0 <= index < HOURS:
            hours[index]["counts"][status] += n
    peak = max([sum(h["counts"].values()) for h in hours] + [1])
    scale = PLOT_HEIGHT / peak
    bars = []
    for i, hour in enumerate(hours):
        x = LEFT + i * (BAR + GAP)
        y = TOP + PLOT_HEIGHT
        segments = []
        for status in CHART_STATUSES:
            n = hour["counts"][status]
            if n:
                height = n * scale
                y -= height
                segments.append({"status": status, "n": n, "y": round(y, 1), "h": round(height, 1)})
        title = ", ".join(f"{n} {s}" for s, n in hour["counts"].items() if n) or "none"
        bars.append(
            {
                "x": x,
                "start": hour["start"],
                "segments": segments,
                "title": f"{hour['start']:%H}:00–{hour['start'] + timedelta(hours=1):%H}:00: {title}",
                "label": f"{hour['start']:%H}" if i % 3 == 0 else "",
                "total": sum(hour["counts"].values()),
            }
        )
    return {
        "bars": bars,
        "peak": peak,
        "statuses": CHART_STATUSES,
        "width": LEFT + HOURS * (BAR + GAP),
        "height": TOP + PLOT_HEIGHT + 22,
        "bar": BAR,
        "top": TOP,
        "base": TOP + PLOT_HEIGHT,
        "label_y": TOP + PLOT_HEIGHT + 16,
        "left": LEFT,
        "finished": sum(b["total"] for b in bars),
    }


def _queue_and_limits(now) -> dict:
    """The queue by owner (the owners with the most queued runs) and each endpoint's budget."""
    owners = (
        Run.objects.filter(status=RunStatus.QUEUED)
        .values("conversation__owner__username")
        .annotate(queued=Count("id"), oldest=Min("queued_at"))
        .order_by("-queued")[:LIST_LIMIT]
    )
    limits = []
    for budget in ProviderBudget.objects.order_by("endpoint")[:LIST_LIMIT]:
        wait = (budget.next_start - now).total_seconds() if budget.next_start else 0.0
        limits.append(
            {
                "endpoint": budget.endpoint,
                "configured": budgets.described(budget.endpoint),
                "learned": f"{budget.learned_rate:.1f}/s" if budget.learned_rate else "—",
                "wait": human_duration(wait) if wait > 0 else "now",
                "limited": wait > health.LIMITED_AFTER,
                "refusals": budget.refusals,
            }
        )
    return {
        "queue_by_owner": [
            {
                "owner": row["conversation__owner__username"],
                "queued": row["queued"],
                "oldest": human_duration(seconds_between(row["oldest"])),
            }
            for row in owners
        ],
        "delayed": Run.objects.not_due(now).count(),
        "limits": limits,
    }
