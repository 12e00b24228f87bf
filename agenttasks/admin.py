"""Admin registration: read-only views of every model (state changes go through the lifecycle)."""

from django.contrib import admin

from .models import Comment, Conversation, Event, File, PendingAction, Run, Task, TaskResult, Wakeup


class ReadOnlyAdmin(admin.ModelAdmin):
    """Lets operators look, never add or edit by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "label",
        "agent",
        "owner",
        "status",
        "attempt",
        "created_at",
        "updated_at",
    )
    list_filter = ("status", "agent", "kind")
    search_fields = ("id", "label", "input")
    list_select_related = ("owner",)


@admin.register(Conversation)
class ConversationAdmin(ReadOnlyAdmin):
    list_display = ("id", "owner", "agent", "hidden", "title", "last_seq", "created_at")
    list_filter = ("hidden", "agent")
    search_fields = ("id", "title")
    list_select_related = ("owner",)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "conversation",
        "task",
        "agent",
        "trigger",
        "status",
        "worker",
        "heartbeat_at",
    )
    list_filter = ("status", "trigger")
    search_fields = ("id",)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("conversation", "seq", "type", "run_id", "task_id", "created_at")
    list_filter = ("type",)


@admin.register(PendingAction)
class PendingActionAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "tool_name", "status", "run", "deadline", "created_at")
    list_filter = ("status", "kind")


@admin.register(Wakeup)
class WakeupAdmin(ReadOnlyAdmin):
    list_display = ("id", "task", "conversation", "status", "state", "created_at", "settled_at")
    list_filter = ("state", "status")


for model in (TaskResult, Comment, File):
    admin.site.register(model, ReadOnlyAdmin)
