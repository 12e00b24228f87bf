"""Request bodies of the REST API (docs/rest.md): each declared field is both a key of the body's
OpenAPI schema and its check.

A body is checked field by field in the order its fields are declared, which is the order of the
errors its section lists, and the first refusal is raised at once (`errors.ApiError`) with the
message the section gives. A field's `source` names the key the view receives; a key the client
leaves out (or sends as null) becomes the field's `absent` value.
"""

from typing import Any

from rest_framework import serializers

from ...delivery import callbacks
from ...toolkit import errors
from ...toolkit.checks import (
    answer,
    blank,
    metadata,
    moment,
    priority,
    reserved_free,
    storable,
    text,
    uploads,
)

# --- fields ----------------------------------------------------------------------------------


class Checked:
    """A request field that checks its own value and says what a missing key stands for."""

    absent: Any = None

    def check(self, value: Any, name: str) -> Any:  # pragma: no cover - every field defines it
        raise NotImplementedError


class String(Checked, serializers.CharField):
    """A JSON string, kept as given."""

    def check(self, value, name):
        if not isinstance(value, str):
            raise errors.validation(f"{name} must be a string", name)
        storable(value, name)
        return value


class Text(Checked, serializers.CharField):
    """Non-blank text of at most MAX_INPUT_CHARS characters; `invalid` refuses any other value."""

    def __init__(self, *, invalid: str, code: str = "VALIDATION_ERROR", **kwargs):
        super().__init__(**kwargs)
        self.invalid, self.code = invalid, code

    def check(self, value, name):
        return text(value, name, required_message=self.invalid, code=self.code)


class Name(Checked, serializers.CharField):
    """A short string within the field's own length limits (a label, a title)."""

    absent = ""

    def check(self, value, name):
        low, high = self.min_length, self.max_length
        if not isinstance(value, str) or not low <= len(value) <= high:
            raise errors.validation(f"{name} must be a string of {low} to {high} characters", name)
        storable(value, name)
        return value


class Metadata(Checked, serializers.DictField):
    """A JSON object within MAX_METADATA_BYTES; `reserved` also refuses the server's own keys."""

    def __init__(self, *, absent: dict | None = None, reserved: bool = False, **kwargs):
        super().__init__(required=False, **kwargs)
        self.absent, self.reserved = absent, reserved

    def check(self, value, name):
        value = metadata(value, name)
        if self.reserved:
            reserved_free(value)
        return value


class FileInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=255)
    content = serializers.CharField(help_text="The bytes, standard base64.")
    mimeType = serializers.CharField(help_text="type/subtype")


class Uploads(Checked, serializers.ListField):
    """FileInput entries (docs/rest.md#files), decoded."""

    def __init__(self, **kwargs):
        super().__init__(child=FileInputSerializer(), required=False, **kwargs)
        self.absent = []

    def check(self, value, name):
        return uploads(value)


class CallbackUrl(Checked, serializers.CharField):
    """An http(s) URL without credentials; its address is checked later, by the view."""

    absent = ""

    def check(self, value, name):
        try:
            callbacks.check_syntax(value)
        except callbacks.CallbackURLError as exc:
            raise errors.validation(str(exc), name) from None
        storable(value, name)
        return value


class Flag(Checked, serializers.BooleanField):
    """A JSON boolean, false when left out."""

    absent = False

    def check(self, value, name):
        if not isinstance(value, bool):
            raise errors.validation(f"{name} must be a boolean", name)
        return value


class Priority(Checked, serializers.IntegerField):
    """An integer from -100 to 100, 0 when left out (higher first)."""

    absent = 0

    def __init__(self, **kwargs):
        super().__init__(required=False, min_value=-100, max_value=100, **kwargs)

    def check(self, value, name):
        return priority(value, name)


class Moment(Checked, serializers.DateTimeField):
    """An ISO 8601 date and time with its offset (`2026-12-05T09:00:00Z`), None when left out."""

    def __init__(self, **kwargs):
        super().__init__(required=False, **kwargs)

    def check(self, value, name):
        return moment(value, name)


class Refused(Checked, serializers.BooleanField):
    """A key the body accepts only as false: `refusal` says what to do instead."""

    absent = False

    def __init__(self, *, refusal: str, **kwargs):
        super().__init__(required=False, **kwargs)
        self.refusal = refusal

    def check(self, value, name):
        if value is not False:
            raise errors.validation(self.refusal, name)
        return value


# --- bodies ----------------------------------------------------------------------------------


class Body(serializers.Serializer):
    """A request body: its declared fields, checked in order (see the module's docstring).

    Required fields are checked together first: when any is missing or blank, `missing` is the
    refusal (with `missing_code`), naming each missing field unless the code is not a validation
    error. A `partial` body changes only the keys it is given, and null is a value it checks.
    """

    missing = ""
    missing_code = "VALIDATION_ERROR"
    partial = False
    # Another spelling a field is read by when the body lacks its own (docs/versioning.md).
    aliases: dict[str, str] = {}

    def to_internal_value(self, data):
        return self.check(data if isinstance(data, dict) else {})

    def check(self, data: dict) -> dict:
        fields: dict[str, Any] = self._declared_fields
        for alias, name in self.aliases.items():
            if name not in data and alias in data:
                data = {**data, name: data[alias]}
        missing = [k for k, f in fields.items() if f.required and blank(data.get(k))]
        if missing:
            if self.missing_code == "VALIDATION_ERROR":
                raise errors.validation(self.missing, *missing)
            raise errors.ApiError(400, self.missing_code, self.missing)
        out = {}
        for name, field in fields.items():
            if self.partial and name not in data:
                continue
            value = data.get(name)
            if value is None and (not self.partial or field.allow_null):
                out[field.source or name] = field.absent
            else:
                out[field.source or name] = field.check(value, name)
        return out

    @classmethod
    def validated(cls, data, **context) -> dict:
        """Check a body (DRF's field machinery is skipped: each field checks itself)."""
        # DRF's constructor sets `partial` on the instance (False unless given): pass the class's.
        body = cls(context=context, partial=cls.partial)
        return body.check(data if isinstance(data, dict) else {})


class TaskCreateSerializer(Body):
    missing = "agentId and input are required"

    agentId = String(source="agent_id", help_text="An agent exposed over REST.")
    input = Text(invalid="input must be a string")
    label = Name(required=False, min_length=1, max_length=200)  # type: ignore[assignment]  # the field is named by the contract
    metadata = Metadata(absent={})
    files = Uploads(source="uploads")
    callbackUrl = CallbackUrl(source="callback_url", required=False, max_length=2000)
    priority = Priority(help_text="Higher first, within each owner's share of the claims.")
    notBefore = Moment(
        source="not_before", help_text="Start no earlier than this (a time past starts now)."
    )


class CommentCreateSerializer(Body):
    missing, missing_code = "content is required", "INVALID_REQUEST"
    aliases = {"message": "content"}  # as a message is written

    content = Text(invalid=missing, code=missing_code)
    metadata = Metadata()
    multitaskStrategy = String(
        source="strategy",
        required=False,
        help_text="When the task is busy: reject (409, the default), enqueue, interrupt, "
        "rollback or steer.",
    )


class CancelSerializer(Body):
    graceful = Flag(required=False, default=False)


class EmptySerializer(Body):
    """No fields: keys a client sends are ignored."""


class ConversationCreateSerializer(Body):
    missing = "agentId is required"

    agentId = String(source="agent_id")
    title = Name(required=False, min_length=1, max_length=200)
    metadata = Metadata(absent={}, reserved=True)


class ConversationUpdateSerializer(Body):
    partial = True

    title = Name(
        required=False, allow_null=True, min_length=1, max_length=200, help_text="null removes it"
    )
    metadata = Metadata(reserved=True)


class MessageCreateSerializer(Body):
    missing = "message is required"
    aliases = {"content": "message"}  # as a comment is written, and as a Message reads

    message = Text(invalid=missing)
    stream = Refused(
        refusal="stream is not supported; follow GET /conversations/{id}/events/stream",
        help_text="Only false: follow GET /conversations/{id}/events/stream.",
    )
    metadata = Metadata()
    files = Uploads(source="uploads")
    multitaskStrategy = String(
        source="strategy",
        required=False,
        help_text="When the conversation is busy: reject (409, the default), enqueue, interrupt, "
        "rollback or steer.",
    )


class ActionAnswerSerializer(Body):
    """An approval (`approved`, `comment`) or the answers to a question (`answers`)."""

    # Which keys apply depends on the action, so the answer rules (agenttasks.lifecycle.answers, shared with
    # the admin and A2A) check the body; these fields only document it.

    approved = serializers.BooleanField(required=False, help_text="Approvals: required.")
    comment = serializers.CharField(required=False, max_length=2000)
    answers = serializers.DictField(
        required=False, help_text="Questions: by question id, a value, values or an object."
    )

    def check(self, data):
        return answer(self.context["action"], data)
