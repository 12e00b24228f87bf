"""What every REST view shares: the app's own policies (toolkit.policies), lookups (404 first, then 403), and the
OpenAPI helpers of the views' schemas."""

from django.db.models import Prefetch
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from drf_spectacular.utils import extend_schema as spectacular_extend_schema

from ... import registry
from ...exceptions import ConversationNotFound, TaskNotFound
from ...models import Conversation, File, Task
from ...toolkit import body, errors
from ...toolkit.identity import check_owner, user_of
from ...toolkit.policies import AppPolicies
from .. import serializers as s
from ..idempotency import HEADER as IDEMPOTENCY_HEADER
from ..idempotency import REPLAYED


def extend_schema(**kwargs):
    """drf-spectacular's extend_schema on its own AutoSchema, whatever DEFAULT_SCHEMA_CLASS is."""

    kwargs.setdefault("description", kwargs.get("summary", ""))

    def decorate(method):
        method.schema = AutoSchema  # the base class extend_schema builds the operation's on
        return spectacular_extend_schema(**kwargs)(method)

    return decorate


def refusals(*statuses: int) -> dict:
    """Return the error answers of an operation's schema: its own statuses, and 401, 429 and 500."""
    described = {
        400: "Invalid request",
        401: "No resolved user (identity_required)",
        403: "Not the owner",
        404: "Not found",
        405: "Method not allowed",
        409: "State conflict",
        415: "Unsupported media type",
        422: "Idempotency-Key reused with another request (idempotency_key_reused)",
        429: "Throttled (rate_limited)",
        500: "Server fault (INTERNAL_ERROR)",
    }
    return {
        code: OpenApiResponse(s.ErrorSerializer, description=described[code])
        for code in (*statuses, 401, 429, 500)
    }


def query_param(name: str, description: str, type=OpenApiTypes.STR) -> OpenApiParameter:
    """Return a query parameter of an operation's schema."""
    return OpenApiParameter(name, type, OpenApiParameter.QUERY, description=description)


def _response_header(name: str, description: str, codes: list[int]) -> OpenApiParameter:
    return OpenApiParameter(
        name, OpenApiTypes.STR, OpenApiParameter.HEADER, description=description, response=codes
    )


LOCATION = _response_header("Location", "The full path of the new resource.", [201])


def keyed(*success: int) -> list[OpenApiParameter]:
    """Return the Idempotency-Key request header, and the replay marker on the success answers."""
    return [
        OpenApiParameter(
            IDEMPOTENCY_HEADER,
            OpenApiTypes.STR,
            OpenApiParameter.HEADER,
            description="1-255 printable ASCII characters; a repeat replays the first answer.",
        ),
        _response_header(REPLAYED, "true when this answer is a replay.", list(success)),
    ]


PAGE_PARAMETERS = [
    query_param("limit", "Page size (clamped to the maximum).", OpenApiTypes.INT),
    query_param("offset", "Items to skip (not with cursor).", OpenApiTypes.INT),
    query_param("cursor", "The nextCursor of the previous page (not with offset)."),
]


class ApiView(AppPolicies):
    """A view of the REST API: the app's policies, its error envelope and its lookups."""

    schema = AutoSchema()
    http_method_names = ["get", "post", "patch", "delete", "head"]

    def get_exception_handler(self):
        return errors.handle

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self.body = None
        method = request.method.lower()
        if method in ("post", "patch", "put", "delete") and hasattr(self, method):
            self.body = body.parse(request)

    # --- lookups: 404 first, then 403 --------------------------------------------------------

    def task(self, task_id: str, *, queryset=None) -> Task:
        """Return the task named in the path, if it exists and the principal owns it."""
        rows = queryset if queryset is not None else task_rows()
        task = rows.named(task_id)
        if task is None:
            raise errors.refusal(TaskNotFound(task_id))
        check_owner(self.request, task.owner_id, "task")
        return task

    def conversation(self, conversation_id: str, *, deleting: bool = False) -> Conversation:
        """Return the conversation named in the path, if the principal owns it (`deleting`: also one
        whose delete has begun)."""
        if not plain_id(conversation_id):
            raise errors.refusal(ConversationNotFound(conversation_id))
        rows = Conversation.objects.all() if deleting else Conversation.objects.visible()
        conversation = rows.filter(pk=conversation_id).first()
        if conversation is None:
            raise errors.refusal(ConversationNotFound(conversation_id))
        check_owner(self.request, conversation.owner_id, "conversation")
        return conversation

    def principal(self):
        return user_of(self.request)

    def location(self, *parts: str) -> str:
        """Return the full path of a resource created under this request's path."""
        return "/".join([self.request.path.rstrip("/"), *parts])


def plain_id(value: str) -> bool:
    """Say whether an id can be looked up at all (a NUL is simply not found, never a 500)."""
    return "\x00" not in value


def task_rows():
    """Return tasks with what their REST shape reads: the current run and the files, in order."""
    return Task.objects.select_related("run").prefetch_related(
        Prefetch("files", queryset=File.objects.order_by("created_at", "id"))
    )


def exposed_agent(agent_id: str):
    """Return the registered agent exposed over REST, or 404."""
    try:
        agent = registry.get(agent_id)
    except registry.UnknownAgent:
        agent = None
    if agent is None or not agent.expose:
        raise errors.not_found(f"Agent not found: {agent_id}")
    return agent
