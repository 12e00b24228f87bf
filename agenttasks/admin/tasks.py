"""The task admin: changelist, detail page, operator actions and the overview."""

import logging
from dataclasses import dataclass

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseBadRequest, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from .. import lifecycle
from ..conf import app_settings
from ..models import File, PendingAction, Run, Task, TaskResult
from ..states import LIVE, ActionKind, ActionStatus, RunStatus, TaskKind
from . import live, operations, overview, timeline, tree
from .base import (
    DELEGATE,
    ReadOnlyAdmin,
    admin_url,
    ago,
    badge,
    human_duration,
    link,
    origin,
    pretty_json,
    run_rows,
    seconds_between,
    total_usage,
    usage_text,
    when,
    with_json,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Operation:
    """An operator action on tasks: its button, what it does, and who may do it."""

    name: str
    label: str
    permission: str  # "cancel" or "retry": TaskAdmin.has_<permission>_permission
    explains: str

    def report(self, tasks) -> operations.Report:
        """Run the operation on each task through the lifecycle; count what happened."""
        report = operations.Report(self.label)
        stopped = 0
        for task in tasks:
            try:
                if self.name == "stop_tree":
                    outcome, ok, below = operations.stop_tree(task)
                    stopped += below
                elif self.name == "retry":
                    outcome, ok = operations.retry(task.pk)
                else:
                    graceful = self.name == "cancel_after_turn"
                    outcome, ok = operations.cancel(task.pk, graceful=graceful)
            except Exception:  # one broken task must not hide what happened to the others
                logger.exception("admin.operation_failed operation=%s task=%s", self.name, task.pk)
                outcome, ok = "failed with an error (see the server log)", False
            report.add(outcome, ok)
        if self.name == "stop_tree":
            report.notes.append(f"{stopped} descendant task{'' if stopped == 1 else 's'} stopped")
        return report


OPERATIONS = {
    op.name: op
    for op in (
        Operation(
            "cancel_now",
            "Cancel now",
            "cancel",
            "Each task ends cancelled at once; a running worker is told to abort at its next "
            "checkpoint and its late result is discarded.",
        ),
        Operation(
            "cancel_after_turn",
            "Cancel after this turn",
            "cancel",
            "A running task finishes its current turn and then ends cancelled (its reply is kept); "
            "a task no worker is running ends cancelled at once.",
        ),
        Operation(
            "retry",
            "Retry",
            "retry",
            "Each failed task starts again as a new attempt on its own conversation; other "
            "tasks are left alone.",
        ),
        Operation(
            "stop_tree",
            "Stop tree",
            "cancel",
            "Each task is cancelled now, and so is every live task spawned or delegated below "
            "it, at any depth.",
        ),
    )
}


class OriginFilter(admin.SimpleListFilter):
    """Top-level tasks (REST, site code), tasks a model spawned, and delegate tasks."""

    title = "origin"
    parameter_name = "origin"

    def lookups(self, request, model_admin):
        return [
            ("top-level", "top-level"),
            ("spawned", "spawned by a model"),
            ("delegate", "delegate"),
        ]

    def queryset(self, request, queryset):
        if self.value() == "top-level":
            return queryset.filter(parent_conversation__isnull=True).exclude(kind=DELEGATE)
        if self.value() == "spawned":
            return queryset.filter(parent_conversation__isnull=False).exclude(kind=DELEGATE)
        if self.value() == "delegate":
            return queryset.filter(kind=DELEGATE)
        return queryset


class KindFilter(admin.SimpleListFilter):
    """The kinds of the tasks there are (plain, delegate, the site's own), shown only when there
    are two or more to choose from: with a single kind the filter would offer nothing but "All"."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        kinds = (
            model_admin.get_queryset(request)
            .order_by("kind")
            .values_list("kind", flat=True)
            .distinct()
        )
        labels = dict(TaskKind.choices)
        return [(kind, labels.get(kind, kind)) for kind in kinds]

    def has_output(self):
        return len(self.lookup_choices) > 1

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        return queryset.filter(kind=self.value())


def _bulk_action(name: str):
    op = OPERATIONS[name]

    def action(modeladmin, request, queryset):
        return modeladmin.bulk(request, queryset, op)

    action.__name__ = name
    return admin.action(description=op.label, permissions=[op.permission])(action)


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    # What an operator reads first, so that the list fits 1280 pixels beside its filters; the id,
    # the attempt and the parent are in the first column, everything else on the task's page.
    list_display = ("task", "status_badge", "progress", "agent", "owner", "updated", "duration")
    list_display_links = None  # the first column links the task (and its parent) itself
    list_filter = (
        "status",
        "agent",
        KindFilter,
        OriginFilter,
        ("owner", admin.RelatedOnlyFieldListFilter),
        "created_at",
    )
    search_fields = ("id", "label", "input")
    list_select_related = ("owner", "run", "parent_conversation__task")
    ordering = ("-created_at", "-id")
    list_per_page = 50
    actions = [_bulk_action(name) for name in OPERATIONS]
    change_list_template = "agenttasks/admin/task_change_list.html"

    # --- columns ------------------------------------------------------------------------------

    @admin.display(description="task", ordering="label")
    def task(self, task):
        """Return the label, linked, over the id, the attempt and where it was spawned from."""
        under = [format_html('<code class="at-id">{}</code>', task.pk)]
        if task.attempt > 1:
            under.append(format_html("attempt {}", task.attempt))
        if task.parent_conversation_id:
            under.append(format_html("from {}", self.parent(task)))
        return format_html(
            '<a href="{}">{}</a><div class="at-under">{}</div>',
            admin_url("task", task.pk),
            task.label or task.pk,
            format_html_join(" · ", "{}", ((part,) for part in under)),
        )

    @admin.display(description="status", ordering="status")
    def status_badge(self, task):
        return badge(task.status, task.get_status_display())

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, task):
        return ago(task.updated_at)

    @admin.display(description="progress")
    def progress(self, task):
        return lifecycle.progress_line(task) or "—"

    @admin.display(description="parent", ordering="parent_conversation")
    def parent(self, task):
        parent_task = tree.task_of(task.parent_conversation)
        if parent_task is not None:
            return link("task", parent_task.pk)
        return link("conversation", task.parent_conversation_id)

    @admin.display(description="duration")
    def duration(self, task):
        return human_duration(seconds_between(task.started_at, task.finished_at))

    def changelist_view(self, request, extra_context=None):
        # The admin's app sidebar would leave the list half the width of a 1280-pixel screen.
        extra_context = {"is_nav_sidebar_enabled": False, **(extra_context or {})}
        return super().changelist_view(request, extra_context)

    # --- permissions --------------------------------------------------------------------------

    def has_cancel_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.cancel_task")

    def has_retry_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.retry_task")

    def has_answer_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.change_pendingaction")

    # --- URLs ---------------------------------------------------------------------------------

    def get_urls(self):
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("overview/", wrap(self.overview_view), name=f"{prefix}_overview"),
            path("<path:object_id>/operate/", wrap(self.operate_view), name=f"{prefix}_operate"),
            path("<path:object_id>/priority/", wrap(self.priority_view), name=f"{prefix}_priority"),
            path("<path:object_id>/live/", wrap(self.live_view), name=f"{prefix}_live"),
            path(
                "<path:object_id>/actions/<str:action_id>/",
                wrap(self.resolve_view),
                name=f"{prefix}_resolve",
            ),
            *super().get_urls(),
        ]

    # --- bulk actions -------------------------------------------------------------------------

    def bulk(self, request, queryset, op: Operation):
        """Confirm, then run an operation on every selected task and report per outcome."""
        tasks = list(queryset.order_by("-created_at", "-id"))
        if request.POST.get("post") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": f"{op.label}: are you sure?",
                "opts": self.opts,
                "operation": op,
                "tasks": tasks,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(request, "agenttasks/admin/confirm_operation.html", context)
        op.report(tasks).send(request)
        return None

    # --- detail page and its buttons ----------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Show everything about one task (read-only) with the buttons an operator may use."""
        task = (
            self.get_queryset(request)
            .select_related("owner", "run", "conversation", "parent_conversation__task")
            .filter(pk=unquote(object_id))
            .first()
        )
        if not self.has_view_permission(request, task):
            raise PermissionDenied
        if task is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        context = {
            **self.admin_site.each_context(request),
            **self.detail_context(request, task),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "agenttasks/admin/task_detail.html", context)

    def live_view(self, request, object_id):
        """Return the task's conversation events, as a stream its page follows (admin/live.py)."""
        task = self.get_queryset(request).filter(pk=unquote(object_id)).first()
        if not self.has_view_permission(request, task):
            raise PermissionDenied
        return live.stream(request, task)

    def detail_context(self, request, task: Task) -> dict:
        runs = list(Run.objects.filter(task=task).order_by("created_at", "id"))
        actions = with_json(
            list(
                PendingAction.objects.filter(task=task)
                .select_related("decided_by")
                .order_by("created_at", "id")
            )
        )
        below, cut = tree.descendants(task.conversation_id)
        entries, hidden = timeline.entries(task.conversation, task_id=task.pk)
        result = TaskResult.objects.filter(task=task).first()
        if result is not None and result.partial and not (result.content or result.files):
            result = None  # a pause that said nothing yet: there is no result to show
        return {
            "opts": self.opts,
            "title": f"Task {task.pk}",
            "subtitle": task.label,
            "task": task,
            "original": task,
            "fields": self.fields_of(task),
            "runs": run_rows(runs),
            "current_run_id": task.run_id,
            "usage_total": total_usage(runs),
            "actions": actions,
            "pending": [a for a in actions if a.status == ActionStatus.PENDING],
            "result": result,
            "result_usage": usage_text(result.usage) if result else "",
            "result_files": json_block(result.files) if result else "",
            "result_metadata": json_block(result.metadata) if result else "",
            "comments": list(task.comments.select_related("author").order_by("created_at", "id")),
            "files": list(File.objects.filter(conversation_id=task.conversation_id)),
            "wakeups": list(task.wakeups.order_by("created_at", "id")),
            "texts": [
                (label, value)
                for label, value in (
                    ("Input", task.input),
                    ("Error", task.error),
                )
                if value
            ],
            "json": [
                (label, json_block(value))
                for label, value in (
                    ("State", task.state),
                    ("Metadata", task.metadata),
                    ("Agent snapshot", task.inherit),
                )
                if json_block(value)
            ],
            "ancestors": tree.ancestors(task),
            "descendants": below,
            "descendants_cut": cut,
            "timeline": entries,
            "timeline_hidden": hidden,
            "buttons": self.buttons(request, task, below),
            "can_answer": self.has_answer_permission(request),
            "can_prioritize": self.has_cancel_permission(request) and task.status in LIVE,
            "approval": ActionKind.APPROVAL,
            "can_delete_conversation": request.user.has_perm(
                f"{self.opts.app_label}.delete_conversation"
            ),
        }

    def buttons(self, request, task: Task, below: list[tuple[Task, int]]) -> list:
        """The operations this user may apply to this task now."""
        can_cancel = self.has_cancel_permission(request)
        live = task.status in LIVE
        return [
            op
            for op in OPERATIONS.values()
            if (op.permission == "cancel" and can_cancel and op.name != "stop_tree" and live)
            or (
                op.name == "retry"
                and lifecycle.retry_refusal(task) is None
                and self.has_retry_permission(request)
            )
            or (
                op.name == "stop_tree"
                and can_cancel
                and (live or any(t.status in LIVE for t, _ in below))
            )
        ]

    def fields_of(self, task: Task) -> list[tuple[str, object]]:
        """Return the task's fields as (label, value) rows; JSON values come back as str."""
        run = task.run
        rows = [
            ("ID", task.pk),
            ("Label", task.label),
            ("Status", badge(task.status, task.get_status_display())),
            ("Agent", task.agent),
            ("Kind", task.kind or "—"),
            ("Origin", origin(task)),
            ("Owner", task.owner or "—"),
            ("Attempt", task.attempt_no()),
            ("Priority", task.priority),
            (
                "Starts at",
                when(run.not_before)
                if run.status == RunStatus.QUEUED
                and run.not_before
                and run.not_before > timezone.now()
                else "—",
            ),
            ("Progress", lifecycle.progress_line(task) or "—"),
            (
                "Current run",
                format_html(
                    "{} {}{}",
                    link("run", task.run_id),
                    badge(run.status, run.get_status_display()),
                    f" (stop requested: {run.get_stop_request_display()})"
                    if run.stop_request
                    else "",
                ),
            ),
            ("Conversation", link("conversation", task.conversation_id)),
            ("Parent conversation", link("conversation", task.parent_conversation_id)),
            ("Spawning run", link("run", task.parent_run_id)),
            ("Depth", task.depth),
            ("Continuations", task.continuations),
            ("Stop reason", task.stop_reason or "—"),
            ("Callback URL", task.callback_url or "—"),
            ("Trace", trace_link(task.traceparent)),
            ("Created", when(task.created_at)),
            ("Updated", when(task.updated_at)),
            ("Started", when(task.started_at)),
            ("Finished", when(task.finished_at)),
            ("Duration", human_duration(seconds_between(task.started_at, task.finished_at))),
        ]
        return rows

    def operate_view(self, request, object_id):
        """Run one operation (a POST button of the detail page) and go back to the task."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        task = self.get_object(request, unquote(object_id))
        if not self.has_view_permission(request, task):
            raise PermissionDenied
        if task is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        op = OPERATIONS.get(request.POST.get("operation", ""))
        if op is None:
            return HttpResponseBadRequest("unknown operation")
        if not getattr(self, f"has_{op.permission}_permission")(request):
            raise PermissionDenied
        op.report([task]).send(request)
        return redirect(admin_url("task", task.pk))

    def priority_view(self, request, object_id):
        """Set the task's priority (operators who may cancel a task may reorder it)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        task = self.get_object(request, unquote(object_id))
        if task is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        try:
            lifecycle.set_priority(task.pk, int(request.POST.get("priority", "")))
        except ValueError:
            messages.error(request, "Not changed: priority must be an integer from -100 to 100.")
        else:
            messages.success(request, f"Priority set to {request.POST['priority'].strip()}.")
        return redirect(admin_url("task", task.pk))

    def resolve_view(self, request, object_id, action_id):
        """Approve, deny or answer one pending action of the task."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_answer_permission(request):
            raise PermissionDenied
        task = self.get_object(request, unquote(object_id))
        if task is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        action = PendingAction.objects.filter(pk=unquote(action_id), task=task).first()
        if action is None:
            raise Http404("No such action on this task.")
        decision = request.POST.get("decision", "")
        resolution = {"decided_by": request.user}
        comment = request.POST.get("comment", "").strip()[:2000]
        if decision in ("approve", "deny") and action.kind == ActionKind.APPROVAL:
            resolution["status"] = "approved" if decision == "approve" else "denied"
            if comment:
                resolution["comment"] = comment
        elif decision == "answer" and action.kind == ActionKind.QUESTION:
            answers, error = read_answers(action.questions or [], request.POST)
            if error:
                messages.error(request, f"Not answered: {error}.")
                return redirect(admin_url("task", task.pk))
            resolution.update(status="answered", answers=answers)
        else:
            return HttpResponseBadRequest("unknown decision")
        text, ok = operations.resolve(action, resolution)
        messages.add_message(request, messages.SUCCESS if ok else messages.WARNING, text)
        return redirect(admin_url("task", task.pk))

    # --- overview -----------------------------------------------------------------------------

    def overview_view(self, request):
        """Counts, running work, failures, the oldest lease and a day of endings."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            **overview.context(),
            "opts": self.opts,
            "title": "Task overview",
            "changelist": reverse(f"admin:{self.opts.app_label}_task_changelist"),
        }
        return TemplateResponse(request, "agenttasks/admin/overview.html", context)


def read_answers(questions: list[dict], data) -> tuple[dict, str]:
    """Normalize a question form to {qid: {"values": [...], "freeText"?: ...}}, or an error."""
    answers = {}
    for question in questions:
        qid = question["id"]
        values = [v for v in data.getlist(f"answer-{qid}") if v]
        text = data.get(f"text-{qid}", "").strip()
        options = [o["value"] for o in question.get("options") or []]
        free = question.get("allowFreeText", not options)
        unknown = [v for v in values if options and v not in options]
        if unknown:
            return {}, f'"{unknown[0]}" is not an option of {qid}'
        if len(values) > 1 and not question.get("multiSelect"):
            return {}, f"{qid} takes one value"
        if text and not free:
            return {}, f"{qid} takes no free text"
        if question.get("required", True) and not values and not text:
            return {}, f"{qid} is required"
        answers[qid] = {"values": values, **({"freeText": text} if text else {})}
    return answers, ""


def json_block(value) -> str:
    """Render a JSON value for a <pre> block ('' for nothing)."""
    return pretty_json(value) if value not in (None, {}, []) else ""


def trace_link(traceparent: str):
    """The task's trace id, linked to the trace viewer when TRACE_URL says where it is."""
    parts = traceparent.split("-")
    if len(parts) != 4:
        return "—"
    trace_id = parts[1]
    template = app_settings.TRACE_URL
    if not template:
        return trace_id
    return format_html('<a href="{}">{}</a>', template.format(trace_id=trace_id), trace_id)
