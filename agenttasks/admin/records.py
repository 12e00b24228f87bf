"""Read-only lists of runs, pending actions, events, wake-ups, results, comments, files and the
model endpoints' budgets."""

from datetime import timedelta

from django.contrib import admin
from django.db.models import Q
from django.utils import timezone

from ..conf import app_settings
from ..flow import budgets
from ..models import (
    Comment,
    Event,
    File,
    PendingAction,
    ProviderBudget,
    Run,
    TaskResult,
    Wakeup,
)
from ..states import ActionStatus, RunStatus
from .base import (
    ReadOnlyAdmin,
    badge,
    human_duration,
    lease,
    lease_cutoff,
    link,
    seconds_between,
    usage_text,
)


class StuckFilter(admin.SimpleListFilter):
    """Runs nobody is moving: running with a stale lease, or queued too long."""

    title = "stuck work"
    parameter_name = "stuck"

    def lookups(self, request, model_admin):
        return [
            ("stale", "stale lease (running, no heartbeat within LEASE_TIMEOUT)"),
            ("alive", "alive lease (running)"),
            ("queued", "queued longer than REQUEUE_AFTER"),
        ]

    def queryset(self, request, queryset):
        cutoff = lease_cutoff()
        stale = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
        if self.value() == "stale":
            return queryset.filter(stale, status=RunStatus.RUNNING)
        if self.value() == "alive":
            return queryset.filter(status=RunStatus.RUNNING).exclude(stale)
        if self.value() == "queued":
            waited = timezone.now() - timedelta(seconds=app_settings.REQUEUE_AFTER)
            return queryset.filter(status=RunStatus.QUEUED, queued_at__lt=waited)
        return queryset


class OverdueFilter(admin.SimpleListFilter):
    """Pending actions past their deadline that the reaper has not settled yet."""

    title = "deadline"
    parameter_name = "deadline"

    def lookups(self, request, model_admin):
        return [("overdue", "pending past its deadline"), ("open", "pending, within deadline")]

    def queryset(self, request, queryset):
        pending = queryset.filter(status=ActionStatus.PENDING)
        if self.value() == "overdue":
            return pending.filter(deadline__lt=timezone.now())
        if self.value() == "open":
            return pending.filter(Q(deadline__gte=timezone.now()) | Q(deadline__isnull=True))
        return queryset


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "task_link",
        "conversation_link",
        "agent",
        "trigger",
        "status_badge",
        "attempt",
        "worker",
        "started_at",
        "heartbeat_at",
        "lease_state",
        "ended_at",
        "duration",
        "stop_request",
    )
    list_filter = ("status", StuckFilter, "trigger", "agent")
    search_fields = ("id", "=task__id", "=conversation__id", "worker")
    ordering = ("-created_at", "-id")
    list_per_page = 50

    @admin.display(description="task", ordering="task")
    def task_link(self, run):
        return link("task", run.task_id)

    @admin.display(description="conversation")
    def conversation_link(self, run):
        return link("conversation", run.conversation_id)

    @admin.display(description="status", ordering="status")
    def status_badge(self, run):
        return badge(run.status, run.get_status_display())

    @admin.display(description="lease")
    def lease_state(self, run):
        state = lease(run)
        return badge(f"lease-{state}", state) if state else "—"

    @admin.display(description="duration")
    def duration(self, run):
        return human_duration(seconds_between(run.started_at, run.ended_at))


@admin.register(PendingAction)
class PendingActionAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "kind",
        "tool_name",
        "status_badge",
        "task_link",
        "run_link",
        "created_at",
        "deadline",
        "overdue",
        "decided_by",
        "decided_at",
    )
    list_filter = ("status", "kind", OverdueFilter, "tool_name")
    search_fields = ("id", "=task__id", "=run__id", "tool_name", "tool_call_id")
    list_select_related = ("decided_by",)
    ordering = ("-created_at", "-id")
    list_per_page = 50

    @admin.display(description="status", ordering="status")
    def status_badge(self, action):
        return badge(action.status, action.get_status_display())

    @admin.display(description="task (answer there)", ordering="task")
    def task_link(self, action):
        return link("task", action.task_id)

    @admin.display(description="run")
    def run_link(self, action):
        return link("run", action.run_id)

    @admin.display(description="overdue", boolean=True)
    def overdue(self, action):
        if action.status != ActionStatus.PENDING or action.deadline is None:
            return None
        return action.deadline < timezone.now()


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "conversation_link", "seq", "type", "run_id", "task_link", "created_at")
    list_filter = ("type",)
    search_fields = ("=id", "=conversation__id", "=task_id", "=run_id")
    list_per_page = 100

    @admin.display(description="conversation", ordering="conversation")
    def conversation_link(self, event):
        return link("conversation", event.conversation_id)

    @admin.display(description="task")
    def task_link(self, event):
        return link("task", event.task_id)


@admin.register(Wakeup)
class WakeupAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "task_link",
        "conversation_link",
        "status",
        "state",
        "label",
        "created_at",
        "settled_at",
    )
    list_filter = ("state", "status")
    search_fields = ("=id", "=task__id", "=conversation__id")
    ordering = ("-created_at", "-id")

    @admin.display(description="task", ordering="task")
    def task_link(self, wakeup):
        return link("task", wakeup.task_id)

    @admin.display(description="owed to")
    def conversation_link(self, wakeup):
        return link("conversation", wakeup.conversation_id)


@admin.register(TaskResult)
class TaskResultAdmin(ReadOnlyAdmin):
    list_display = ("id", "task_link", "run_id", "partial", "usage_line", "created_at")
    list_filter = ("partial",)
    search_fields = ("=id", "=task__id", "=run_id")
    ordering = ("-created_at", "-id")

    @admin.display(description="task", ordering="task")
    def task_link(self, result):
        return link("task", result.task_id)

    @admin.display(description="usage")
    def usage_line(self, result):
        return usage_text(result.usage) or "—"


@admin.register(Comment)
class CommentAdmin(ReadOnlyAdmin):
    list_display = ("id", "task_link", "role", "author", "excerpt", "run_id", "created_at")
    list_filter = ("role",)
    search_fields = ("=id", "=task__id", "content")
    list_select_related = ("author",)
    ordering = ("-created_at", "-id")

    @admin.display(description="task", ordering="task")
    def task_link(self, comment):
        return link("task", comment.task_id)

    @admin.display(description="content")
    def excerpt(self, comment):
        return comment.content[:80]


@admin.register(File)
class FileAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "name",
        "mime_type",
        "size",
        "conversation_link",
        "task_link",
        "owner",
        "created_at",
        "expires_at",
    )
    list_filter = ("mime_type",)
    search_fields = ("=id", "name", "=conversation__id", "=task__id")
    list_select_related = ("owner",)
    ordering = ("-created_at", "-id")

    @admin.display(description="conversation")
    def conversation_link(self, file):
        return link("conversation", file.conversation_id)

    @admin.display(description="task")
    def task_link(self, file):
        return link("task", file.task_id)


@admin.register(ProviderBudget)
class ProviderBudgetAdmin(ReadOnlyAdmin):
    """Each model endpoint's shared budget (docs/operating.md#meeting-your-providers-limits)."""

    list_display = (
        "endpoint",
        "configured",
        "learned_rate",
        "next_start",
        "paused_until",
        "refusals",
        "limited_at",
    )
    ordering = ("endpoint",)

    @admin.display(description="configured limits")
    def configured(self, budget):
        return budgets.described(budget.endpoint)
