"""The envelopes the REST API wraps its shapes in (docs/rest.md), and the error envelope.

They only document the responses: a view writes the envelope's keys around the shapes it
presents (`{"task": TaskSerializer.present(task)}`).
"""

from rest_framework import serializers

from .shapes import (
    AgentSerializer,
    CommentSerializer,
    ConversationSerializer,
    EventSerializer,
    FileSerializer,
    MessageSerializer,
    PendingActionSerializer,
    RunSerializer,
    TaskResultSerializer,
    TaskSerializer,
)


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField(required=False)


class ErrorSerializer(serializers.Serializer):
    """The uniform error envelope."""

    error = ErrorBodySerializer()


class PageFields(serializers.Serializer):
    total = serializers.IntegerField(min_value=0)
    limit = serializers.IntegerField(min_value=1)
    offset = serializers.IntegerField(min_value=0)
    hasMore = serializers.BooleanField()
    nextCursor = serializers.CharField(
        allow_null=True, help_text="The cursor of the next page; null on the last page."
    )


class TaskEnvelopeSerializer(serializers.Serializer):
    task = TaskSerializer()


class TaskDetailSerializer(serializers.Serializer):
    task = TaskSerializer()
    result = TaskResultSerializer(required=False)
    pendingActions = PendingActionSerializer(many=True, required=False)


class TaskPageSerializer(PageFields):
    tasks = TaskSerializer(many=True)


class ResultEnvelopeSerializer(serializers.Serializer):
    result = TaskResultSerializer()


class RunListSerializer(serializers.Serializer):
    runs = RunSerializer(many=True)
    total = serializers.IntegerField(min_value=0)


class CommentCreatedSerializer(serializers.Serializer):
    comment = CommentSerializer()
    task = TaskSerializer()


class CommentAcceptedSerializer(serializers.Serializer):
    task = TaskSerializer()
    run = RunSerializer(help_text="The run the comment waits as, or the run it steered.")
    message = MessageSerializer(required=False, help_text="The message.steer event of a steer.")


class CommentListSerializer(serializers.Serializer):
    comments = CommentSerializer(many=True)
    total = serializers.IntegerField(min_value=0)


class ConversationEnvelopeSerializer(serializers.Serializer):
    conversation = ConversationSerializer()


class ConversationPageSerializer(PageFields):
    conversations = ConversationSerializer(many=True)


class MessagePageSerializer(PageFields):
    messages = MessageSerializer(many=True)


class MessageAcceptedSerializer(serializers.Serializer):
    message = MessageSerializer(required=False, help_text="Absent while its run is waiting.")
    run = RunSerializer()


class RunEnvelopeSerializer(serializers.Serializer):
    run = RunSerializer()


class EventPageSerializer(serializers.Serializer):
    events = EventSerializer(many=True)
    after = serializers.IntegerField(min_value=0)
    limit = serializers.IntegerField(min_value=1)
    lastSeq = serializers.IntegerField(min_value=0)
    hasMore = serializers.BooleanField()


class ActionListSerializer(serializers.Serializer):
    actions = PendingActionSerializer(many=True)
    total = serializers.IntegerField(min_value=0)


class ActionResolvedSerializer(serializers.Serializer):
    action = PendingActionSerializer()
    task = TaskSerializer(required=False)


class FileEnvelopeSerializer(serializers.Serializer):
    file = FileSerializer()


class AgentListSerializer(serializers.Serializer):
    agents = AgentSerializer(many=True)


class AgentEnvelopeSerializer(serializers.Serializer):
    agent = AgentSerializer()
