"""The schedule admin: schedules and their clocks, their recent ticks, and pause, resume, run now
and delete, each through `lifecycle.schedules` (docs/lifecycle.md#schedules).

Nothing is added or edited by hand: REST and the Python API create and change schedules.
"""

import logging

from django.contrib import admin
from django.forms.models import BaseInlineFormSet
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from ..exceptions import ScheduleNotFound
from ..lifecycle import schedules
from ..models import Schedule, ScheduleTick
from ..states import TickOutcome
from . import operations
from .base import CSS, admin_url, badge, link, pretty_json

logger = logging.getLogger(__name__)

RECENT_TICKS = 50  # the ticks a schedule's page shows, newest first
# The badge colour of each tick outcome (the classes of admin.css).
OUTCOME_BADGES = {
    TickOutcome.CREATED: "completed",
    TickOutcome.POSTED: "completed",
    TickOutcome.SKIPPED: "dropped",
    TickOutcome.REFUSED: "failed",
}


def clock_text(schedule: Schedule) -> str:
    """Say when a schedule ticks: '0 9 * * * (Europe/Paris)' or 'every 60 s (UTC)'."""
    when = schedule.cron if schedule.cron else f"every {schedule.interval} s"
    return f"{when} ({schedule.timezone})"


class StatusFilter(admin.SimpleListFilter):
    """Active schedules (ticking on their clock) and paused ones."""

    title = "status"
    parameter_name = "paused"

    def lookups(self, request, model_admin):
        return [("no", "active"), ("yes", "paused")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(paused_at__isnull=self.value() == "no")
        return queryset


class RecentTicks(BaseInlineFormSet):
    """Only the newest RECENT_TICKS ticks: a schedule every second has many."""

    def get_queryset(self):
        if not hasattr(self, "_queryset"):
            self._queryset = super().get_queryset()[:RECENT_TICKS]
        return self._queryset


class TickInline(admin.TabularInline):
    model = ScheduleTick
    formset = RecentTicks
    verbose_name_plural = f"recent ticks (the last {RECENT_TICKS})"
    fields = ("due_at", "outcome_badge", "task_link", "run_link", "detail", "created_at")
    readonly_fields = fields
    ordering = ("-due_at", "-id")
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    @admin.display(description="outcome")
    def outcome_badge(self, tick):
        return badge(OUTCOME_BADGES.get(tick.outcome, ""), tick.get_outcome_display())

    @admin.display(description="task")
    def task_link(self, tick):
        return link("task", tick.task_id)

    @admin.display(description="run")
    def run_link(self, tick):
        return link("run", tick.run_id)

    # A schedule's ticks are part of it: whoever may view the schedule sees them; nobody edits.

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.view_schedule")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _operate(modeladmin, request, queryset, verb: str, act) -> None:
    """Apply `act(schedule)` to each selected schedule; report what happened, by outcome."""
    report = operations.Report(verb)
    for schedule in queryset.order_by("-created_at", "-id"):
        try:
            outcome, ok = act(schedule)
        except ScheduleNotFound:
            outcome, ok = "not found", False
        except Exception:  # one broken schedule must not hide what happened to the others
            logger.exception(
                "admin.schedule_operation_failed operation=%s schedule=%s", verb, schedule.pk
            )
            outcome, ok = "failed with an error (see the server log)", False
        report.add(outcome, ok)
    modeladmin.message_user(request, report.message(), report.level)


def _pause(schedule: Schedule) -> tuple[str, bool]:
    if schedule.paused:
        return "already paused", False
    schedules.pause_schedule(schedule.pk)
    return "paused", True


def _resume(schedule: Schedule) -> tuple[str, bool]:
    if not schedule.paused:
        return "already active", False
    schedules.resume_schedule(schedule.pk)
    return "resumed", True


def _run_now(schedule: Schedule) -> tuple[str, bool]:
    tick = schedules.run_now(schedule.pk)
    if tick.outcome in (TickOutcome.CREATED, TickOutcome.POSTED):
        return tick.get_outcome_display(), True
    said = tick.get_outcome_display()
    return (f"{said}: {tick.detail}" if tick.detail else said), False


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = (
        "schedule",
        "owner",
        "agent",
        "clock",
        "status_badge",
        "next_run_at",
        "last_run_at",
    )
    list_display_links = None  # the first column links the schedule itself
    list_filter = (StatusFilter, "agent")
    search_fields = ("id", "label", "agent")
    list_select_related = ("owner",)
    ordering = ("-created_at", "-id")
    list_per_page = 50
    actions = ["pause", "resume", "run_now"]  # and the site's delete_selected
    inlines = [TickInline]
    fields = (
        "id",
        "label",
        "status_badge",
        "owner",
        "agent",
        "target",
        "input",
        "clock",
        "next_run_at",
        "last_run_at",
        "strategy",
        "missed",
        "metadata_json",
        "q_row",
        "paused_at",
        "created_at",
        "updated_at",
    )
    readonly_fields = fields

    class Media:
        css = CSS

    # --- columns and fields -------------------------------------------------------------------

    @admin.display(description="schedule", ordering="label")
    def schedule(self, schedule):
        """Return the label, linked, over the id."""
        return format_html(
            '<a href="{}">{}</a><div class="at-under"><code class="at-id">{}</code></div>',
            admin_url("schedule", schedule.pk),
            schedule.label or schedule.pk,
            schedule.pk,
        )

    @admin.display(description="clock")
    def clock(self, schedule):
        return clock_text(schedule)

    @admin.display(description="status", ordering="paused_at")
    def status_badge(self, schedule):
        return badge("paused", "paused") if schedule.paused else badge("running", "active")

    @admin.display(description="each tick")
    def target(self, schedule):
        if schedule.conversation_id:
            return format_html("posts into {}", link("conversation", schedule.conversation_id))
        return "creates a task"

    @admin.display(description="metadata")
    def metadata_json(self, schedule):
        return format_html("<pre>{}</pre>", pretty_json(schedule.metadata or {}))

    @admin.display(description="django-q2 schedule")
    def q_row(self, schedule):
        """Link django-q2's row (to its admin, when the site registers one); '—' for a schedule
        created paused, never armed."""
        if schedule.q_schedule_id is None:
            return "—"
        try:
            url = reverse("admin:django_q_schedule_change", args=[schedule.q_schedule_id])
        except NoReverseMatch:
            return schedule.q_schedule_id
        return format_html('<a href="{}">{}</a>', url, schedule.q_schedule_id)

    # --- permissions: nothing is added or edited by hand --------------------------------------

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request, obj=None):
        """Pause, resume and run now: whoever may change schedules (through the lifecycle)."""
        return request.user.has_perm(f"{self.opts.app_label}.change_schedule")

    # --- actions ------------------------------------------------------------------------------

    @admin.action(description="Pause", permissions=["operate"])
    def pause(self, request, queryset):
        _operate(self, request, queryset, "Pause", _pause)

    @admin.action(description="Resume", permissions=["operate"])
    def resume(self, request, queryset):
        _operate(self, request, queryset, "Resume", _resume)

    @admin.action(description="Run now (one tick each)", permissions=["operate"])
    def run_now(self, request, queryset):
        _operate(self, request, queryset, "Run now", _run_now)

    # --- deleting goes through the lifecycle, django-q2's row and all -------------------------

    def get_deleted_objects(self, objs, request):
        """Describe each schedule and its ticks; the tasks it created stay, without it."""
        described, ticks = [], 0
        for schedule in objs:
            n = schedule.ticks.count()
            ticks += n
            described.append(
                format_html(
                    "Schedule {} ({}, agent {}): {} tick{}",
                    link("schedule", schedule.pk, schedule.label or schedule.pk),
                    clock_text(schedule),
                    schedule.agent,
                    n,
                    "" if n == 1 else "s",
                )
            )
        return described, {"schedules": len(described), "ticks": ticks}, set(), []

    def delete_model(self, request, obj):
        schedules.delete_schedule(obj.pk)

    def delete_queryset(self, request, queryset):
        for schedule_id in list(queryset.values_list("pk", flat=True)):
            try:
                schedules.delete_schedule(schedule_id)
            except ScheduleNotFound:
                pass  # deleted meanwhile
