"""The conversation admin: changelist, detail with its timeline, and tree-aware delete."""

from collections import Counter

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.template.response import TemplateResponse
from django.utils.html import format_html

from .. import lifecycle, store
from ..exceptions import ConversationNotFound
from ..models import Conversation, Event, File, PendingAction, Run, Task, Wakeup
from ..states import LIVE
from . import timeline, tree
from .base import CSS, badge, link, pretty_json, run_rows, total_usage, with_json


class VisibilityFilter(admin.SimpleListFilter):
    title = "visibility"
    parameter_name = "visibility"

    def lookups(self, request, model_admin):
        return [("visible", "visible"), ("hidden", "hidden (a model spawned its task)")]

    def queryset(self, request, queryset):
        if self.value() in ("visible", "hidden"):
            return queryset.filter(hidden=self.value() == "hidden")
        return queryset


class SourceFilter(admin.SimpleListFilter):
    title = "source"
    parameter_name = "source"

    def lookups(self, request, model_admin):
        return [("task", "a task's conversation"), ("other", "other conversations")]

    def queryset(self, request, queryset):
        is_task = Q(metadata__source="task")
        if self.value() == "task":
            return queryset.filter(is_task)
        if self.value() == "other":
            return queryset.filter(~is_task | Q(metadata__source__isnull=True))
        return queryset


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "owner",
        "agent",
        "visibility",
        "source_name",
        "task_link",
        "parent_link",
        "created_at",
        "event_count",
    )
    list_filter = (
        VisibilityFilter,
        SourceFilter,
        "agent",
        ("owner", admin.RelatedOnlyFieldListFilter),
        "created_at",
    )
    search_fields = ("id", "title")
    list_select_related = ("owner", "task")
    ordering = ("-created_at", "-id")
    list_per_page = 50
    delete_confirmation_template = "agenttasks/admin/conversation_delete_confirmation.html"

    class Media:
        css = CSS

    def get_queryset(self, request):
        events = (
            Event.objects.filter(conversation=OuterRef("pk"))
            .order_by()
            .values("conversation")
            .annotate(n=Count("id"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(event_count=Coalesce(Subquery(events, output_field=IntegerField()), 0))
        )

    # --- columns ------------------------------------------------------------------------------

    @admin.display(description="visibility", ordering="hidden")
    def visibility(self, conversation):
        return "hidden" if conversation.hidden else "visible"

    @admin.display(description="source")
    def source_name(self, conversation):
        return conversation.source or "—"

    @admin.display(description="task")
    def task_link(self, conversation):
        task = tree.task_of(conversation)
        if task is None:
            return "—"
        return format_html(
            "{} {}", link("task", task.pk), badge(task.status, task.get_status_display())
        )

    @admin.display(description="parent")
    def parent_link(self, conversation):
        return link("conversation", conversation.parent_id)

    @admin.display(description="events", ordering="event_count")
    def event_count(self, conversation):
        return conversation.event_count

    # --- nothing is added or edited by hand ---------------------------------------------------

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    # --- detail page --------------------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Show a conversation: its fields, tasks, runs, actions, files and timeline."""
        conversation = (
            self.get_queryset(request)
            .select_related("owner", "task")
            .filter(pk=unquote(object_id))
            .first()
        )
        if not self.has_view_permission(request, conversation):
            raise PermissionDenied
        if conversation is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        entries, hidden = timeline.entries(conversation)
        runs = list(Run.objects.filter(conversation=conversation).order_by("created_at", "id"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Conversation {conversation.pk}",
            "subtitle": conversation.title,
            "conversation": conversation,
            "original": conversation,
            "task": tree.task_of(conversation),
            "metadata": pretty_json(conversation.metadata or {}),
            "spawned": list(
                Task.objects.filter(parent_conversation=conversation).order_by("created_at", "id")
            ),
            "runs": run_rows(runs),
            "usage_total": total_usage(runs),
            "actions": with_json(
                list(
                    PendingAction.objects.filter(conversation=conversation)
                    .select_related("decided_by")
                    .order_by("created_at", "id")
                )
            ),
            "files": list(File.objects.filter(conversation=conversation)),
            "wakeups": list(
                Wakeup.objects.filter(conversation=conversation).order_by("created_at", "id")
            ),
            "timeline": entries,
            "timeline_hidden": hidden,
            "can_delete": self.has_delete_permission(request, conversation),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "agenttasks/admin/conversation_detail.html", context)

    # --- deleting goes through the lifecycle, tree and all ------------------------------------

    def get_deleted_objects(self, objs, request):
        """Describe each conversation's whole tree: tasks, hidden conversations, files."""
        described, counts, seen = [], Counter(), set()
        for conversation in objs:
            ids = [i for i in store.conversation_tree(conversation.pk) if i not in seen]
            seen.update(ids)
            if not ids:
                continue  # already inside the tree of another selected conversation
            tasks = list(
                Task.objects.filter(
                    Q(conversation_id__in=ids) | Q(parent_conversation_id__in=ids)
                ).order_by("created_at", "id")
            )
            files = list(File.objects.filter(conversation_id__in=ids).order_by("name"))
            counts["conversations"] += len(ids)
            counts["tasks"] += len(tasks)
            counts["tasks still live (stopped first)"] += sum(t.status in LIVE for t in tasks)
            counts["runs"] += Run.objects.filter(conversation_id__in=ids).count()
            counts["events"] += Event.objects.filter(conversation_id__in=ids).count()
            counts["files"] += len(files)
            below = [
                format_html(
                    "Task {} {} {} — its conversation {}",
                    link("task", t.pk),
                    badge(t.status, t.get_status_display()),
                    t.label,
                    link("conversation", t.conversation_id),
                )
                for t in tasks
            ]
            below += [
                format_html("File {} ({} bytes, {})", f.name, f.size, f.mime_type) for f in files
            ]
            described.append(
                format_html(
                    "Conversation {} ({}, agent {})",
                    link("conversation", conversation.pk),
                    "hidden" if conversation.hidden else "visible",
                    conversation.agent,
                )
            )
            if below:
                described.append(below)
        return described, dict(counts), set(), []

    def delete_view(self, request, object_id, extra_context=None):
        # Django wraps a confirmed delete in one transaction; the lifecycle's delete must commit
        # in steps (mark the tree deleting, stop its runs, delete) so that workers in other
        # processes see the tree marked before it goes, and are not blocked behind our lock.
        return self._delete_view(request, object_id, extra_context)

    def delete_model(self, request, obj):
        lifecycle.delete_conversation(obj.pk)

    def delete_queryset(self, request, queryset):
        for conversation_id in list(queryset.values_list("pk", flat=True)):
            try:
                lifecycle.delete_conversation(conversation_id)
            except ConversationNotFound:
                pass  # it went with the tree of a conversation deleted before it
