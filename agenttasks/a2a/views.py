"""The A2A views: the Agent Card, the JSON-RPC binding and the HTTP+JSON binding.

Both bindings are DRF views with the REST API's own policies (docs/rest.md): its authentication
classes, the identity rule (ALLOW_ANONYMOUS), the `read`/`write` throttles, and its body reading
(MAX_REQUEST_BYTES, MAX_JSON_DEPTH). Refusals are answered in the binding's terms: a JSON-RPC
error object with the protocol's code, or an HTTP+JSON error (`google.rpc.Status` with an
`ErrorInfo` reason) with the protocol's HTTP status. A missing identity is HTTP 401 and a throttle
HTTP 429 on both bindings.
"""

import json
import logging

from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import A2A_JSON_MEDIA_TYPE, VERSION_HEADER
from a2a.utils.error_handlers import build_error_details, build_rest_error_payload
from a2a.utils.errors import (
    A2A_ERROR_MAPPING,
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    JSONParseError,
    MethodNotFoundError,
    TaskNotFoundError,
    UnsupportedOperationError,
    VersionNotSupportedError,
)
from a2a.utils.proto_utils import parse_params
from django.http import HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from google.protobuf import json_format
from rest_framework import exceptions
from rest_framework.views import set_rollback

from .. import registry, tracing
from ..conf import app_settings
from ..exceptions import TaskError
from ..store import faults
from ..toolkit import body as api_body
from ..toolkit import caps, errors, streams
from ..toolkit.policies import AppPolicies
from ..toolkit.throttling import ScopeThrottle
from . import card, mapping, service, stream

logger = logging.getLogger(__name__)

JSONRPC = "jsonrpc"
REST = "rest"


def a2a_agent(agent_id: str):
    """Return the agent served over A2A, or None."""
    try:
        agent = registry.get(agent_id)
    except registry.UnknownAgent:
        return None
    return agent if agent.expose and agent.a2a else None


def agent_root(request, agent_id: str) -> str:
    """Return the absolute URL of the agent's A2A root, from the path this request came in on."""
    marker = f"/a2a/{agent_id}"
    path = request.path
    return request.build_absolute_uri(path[: path.index(marker) + len(marker)])


def build_error_response(request_id, error: A2AError) -> dict:
    """Return a JSON-RPC error response: the protocol's code, and an ErrorInfo naming the error."""
    body = {"code": JSON_RPC_ERROR_CODE_MAP.get(type(error), -32603), "message": error.message}
    body["data"] = build_error_details(error)
    return {"jsonrpc": "2.0", "id": request_id, "error": body}


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class HttpRefusal(Exception):
    """A refusal that is an HTTP status on both bindings (identity, throttle)."""

    def __init__(self, status: int, message: str, headers=None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


IDENTITY_AND_THROTTLE = (
    exceptions.NotAuthenticated,
    exceptions.AuthenticationFailed,
    exceptions.Throttled,
    exceptions.PermissionDenied,
)


def translate(exc) -> Exception:
    """DRF's, the API's and the lifecycle's refusals as an A2A error or an HTTP refusal."""
    if isinstance(exc, (A2AError, HttpRefusal)):
        return exc
    if isinstance(exc, IDENTITY_AND_THROTTLE):
        exc = errors.translate(exc, {})  # the REST API's 401, 403 and 429, as REST words them
    if isinstance(exc, errors.ApiError):
        if exc.status in (401, 403, 429):
            return HttpRefusal(exc.status, exc.message, exc.headers)
        if exc.message == "Malformed JSON body":
            return JSONParseError(exc.message)
        if exc.status == 404:
            return TaskNotFoundError(exc.message)
        if exc.status == 415:
            return InvalidRequestError(exc.message)
        return (
            InvalidParamsError(exc.message)
            if exc.status == 400
            else InvalidRequestError(exc.message)
        )
    if isinstance(exc, TaskError) and exc.status_code < 500:
        message = errors.refusal(exc).message
        if exc.status_code == 404:
            return TaskNotFoundError(message)
        if exc.status_code == 429:
            return HttpRefusal(429, message)
        return UnsupportedOperationError(message)
    if isinstance(exc, exceptions.MethodNotAllowed):
        return HttpRefusal(405, str(exc.detail))
    if faults.lost_connection(exc):
        logger.warning("a2a.database_unavailable", exc_info=(type(exc), exc, exc.__traceback__))
        unavailable = errors.unavailable()
        return HttpRefusal(unavailable.status, unavailable.message, unavailable.headers)
    logger.error("a2a.internal_error", exc_info=(type(exc), exc, exc.__traceback__))
    return InternalError("An unexpected error occurred")


class A2AView(AppPolicies):
    """The REST API's authentication, identity rule and throttles; the binding's errors."""

    binding = JSONRPC
    schema = None  # not part of the REST API's OpenAPI document
    request_id = None
    traced = tracing.NOTHING

    def dispatch(self, request, *args, **kwargs):
        # One span per A2A request (docs/operating.md#traces), named for its method once known.
        attributes = {
            "a2a.agent.id": kwargs.get("agentId", ""),
            "a2a.binding": self.binding,
            "a2a.protocol.version": "1.0",
            "a2a.task.id": kwargs.get("taskId"),
        }
        with tracing.span("a2a", attributes, kind="SERVER") as self.traced:
            return super().dispatch(request, *args, **kwargs)

    def traced_as(self, method: str) -> None:
        """Name the request's span for its A2A method."""
        self.traced.rename(method)
        self.traced.set("a2a.method", method)

    def initial(self, request, *args, **kwargs):
        agent = a2a_agent(kwargs.get("agentId", ""))
        if agent is None:
            raise HttpRefusal(404, f"Agent not found: {kwargs.get('agentId', '')}")
        super().initial(request, *args, **kwargs)
        version = (request.META.get("HTTP_A2A_VERSION") or "").strip()
        if version and not (version == "1" or version.startswith("1.")):
            raise VersionNotSupportedError(f"{VERSION_HEADER} {version} is not supported (1.0)")
        root = agent_root(request, agent.id)
        self.call = service.Call(request, agent, root[: root.rindex("/a2a/")])

    def handle_exception(self, exc):
        error = translate(exc)
        set_rollback()
        self.traced.fail(type(error).__name__, str(getattr(error, "message", "") or error))
        if isinstance(error, HttpRefusal):
            response = self.http_refusal(error)
            for name, value in error.headers.items():
                response[name] = value
            return response
        return self.a2a_error(error)

    def http_refusal(self, error: HttpRefusal) -> HttpResponse:
        body = {"error": {"code": error.status, "status": _grpc(error.status)}}
        body["error"]["message"] = error.message
        return JsonResponse(body, status=error.status)

    def a2a_error(self, error: A2AError) -> HttpResponse:  # pragma: no cover - per binding
        raise NotImplementedError

    def stream_place(self):
        """Take one of the user's MAX_STREAMS_PER_USER places (429 when all are held), taken before
        a streamed message creates or answers anything."""
        return caps.take(
            self.request,
            caps.STREAM,
            app_settings.MAX_STREAMS_PER_USER,
            app_settings.SLOT_LEASE_SECONDS,
        )

    def send_streamed(self, req):
        """Send a message for a stream: (held place, Sent); the place is given back on a refusal."""
        held = self.stream_place()
        try:
            return held, service.send(self.call, req)
        except BaseException:
            held.release()
            raise

    def streaming(self, task_id: str, frame, error_frame, sent=None, held=None):
        held = held if held is not None else self.stream_place()
        request = self.request._request
        follower = stream.TaskFollower(
            self.call,
            task_id,
            frame,
            error_frame,
            held=held,
            client_fd=caps.client_socket(request),  # None under ASGI
            sent=sent,
        )
        return streams.serve(follower, request)


def _grpc(status: int) -> str:
    return {
        401: "UNAUTHENTICATED",
        403: "PERMISSION_DENIED",
        404: "NOT_FOUND",
        405: "UNIMPLEMENTED",
        503: "UNAVAILABLE",
    }.get(status, "RESOURCE_EXHAUSTED" if status == 429 else "INVALID_ARGUMENT")


# --- the Agent Card ----------------------------------------------------------------------------


@method_decorator(csrf_exempt, name="dispatch")  # read-only: another method is a JSON 405
class AgentCardView(View):
    """The public Agent Card (discovery needs no identity: it says which one to bring)."""

    http_method_names = ["get", "head"]

    def http_method_not_allowed(self, request, *args, **kwargs):
        body = {"error": {"code": 405, "status": _grpc(405), "message": "Method not allowed"}}
        response = JsonResponse(body, status=405)
        response["Allow"] = "GET, HEAD"
        return response

    def get(self, request, agentId):
        agent = a2a_agent(agentId)
        if agent is None:
            return JsonResponse({"error": {"code": 404, "message": "Agent not found"}}, status=404)
        built = card.agent_card(agent, agent_root(request, agent.id))
        response = HttpResponse(
            _json(json_format.MessageToDict(built)), content_type="application/json"
        )
        response["Cache-Control"] = "public, max-age=60"
        return response


# --- JSON-RPC ----------------------------------------------------------------------------------

METHODS = {
    "SendMessage": (pb.SendMessageRequest, service.send_message),
    "GetTask": (pb.GetTaskRequest, service.get_task),
    "ListTasks": (pb.ListTasksRequest, service.list_tasks),
    "CancelTask": (pb.CancelTaskRequest, service.cancel_task),
    "CreateTaskPushNotificationConfig": (
        pb.TaskPushNotificationConfig,
        service.create_push_config,
    ),
    "GetTaskPushNotificationConfig": (
        pb.GetTaskPushNotificationConfigRequest,
        service.get_push_config,
    ),
    "ListTaskPushNotificationConfigs": (
        pb.ListTaskPushNotificationConfigsRequest,
        service.list_push_configs,
    ),
    "DeleteTaskPushNotificationConfig": (
        pb.DeleteTaskPushNotificationConfigRequest,
        service.delete_push_config,
    ),
}
STREAMING = {
    "SendStreamingMessage": pb.SendMessageRequest,
    "SubscribeToTask": pb.SubscribeToTaskRequest,
}
# Methods that only read: the `read` throttle, as GET is over REST; every other is a write.
READS = {
    "GetTask",
    "ListTasks",
    "SubscribeToTask",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "GetExtendedAgentCard",
}


def parse(cls, params):
    """Parse the params as a request of `cls`; a SendMessageRequest with its JSON (SendRequest)."""
    params = params or {}
    check_enums(cls, params)
    try:
        if cls is pb.SendMessageRequest:
            return service.SendRequest(send_request(params), params)
        return json_format.ParseDict(params, cls(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidParamsError(str(exc)) from None


def send_request(params: dict) -> pb.SendMessageRequest:
    """Read a SendMessageRequest, without its JSON values if one overflows a double."""
    try:
        return json_format.ParseDict(params, pb.SendMessageRequest(), ignore_unknown_fields=True)
    except OverflowError:
        # In the metadata or a data part, which the service reads from the JSON as sent.
        return json_format.ParseDict(
            mapping.without_values(params), pb.SendMessageRequest(), ignore_unknown_fields=True
        )


def check_enums(cls, params) -> None:
    """Refuse an unknown value of a top-level enum (`status: "BOGUS"`).

    Parsing that ignores unknown fields reads an unknown enum name as the unset value, which
    would filter nothing.
    """
    if not isinstance(params, dict):  # a QueryDict is one too; ParseDict refuses the rest
        return
    for field in cls.DESCRIPTOR.fields:
        if field.enum_type is None:
            continue
        for name in {field.json_name, field.name}:
            if name not in params:
                continue
            value = params[name]
            if isinstance(value, str) and value.lstrip("-").isdigit():
                value = int(value)
            known = (
                value in field.enum_type.values_by_name
                if isinstance(value, str)
                else isinstance(value, int)
                and not isinstance(value, bool)
                and value in field.enum_type.values_by_number
            )
            if not known:
                raise InvalidParamsError(f"Unknown {field.json_name}: {value}")


class JsonRpcView(A2AView):
    """POST <mount>/a2a/<agentId>/: one JSON-RPC 2.0 request (no batches)."""

    binding = JSONRPC
    http_method_names = ["post"]

    def a2a_error(self, error):
        return JsonResponse(build_error_response(self.request_id, error))

    def check_throttles(self, request):
        # The body is read first to learn the method (its refusal waits until after the throttle).
        try:
            self.body, self.body_error = api_body.parse(request), None
        except errors.ApiError as exc:
            self.body, self.body_error = None, exc
        super().check_throttles(request)

    def get_throttles(self):
        data = self.body if isinstance(getattr(self, "body", None), dict) else {}
        scope = "read" if data.get("method") in READS else "write"
        return [ScopeThrottle(scope)] if (app_settings.THROTTLE_RATES or {}).get(scope) else []

    def post(self, request, agentId):
        if self.body_error is not None:
            raise self.body_error
        data = self.body
        if data is None:
            raise InvalidRequestError("The body must be a JSON-RPC 2.0 request")
        self.request_id = data.get("id") if isinstance(data.get("id"), (str, int)) else None
        method = data.get("method")
        if data.get("jsonrpc") != "2.0" or not isinstance(method, str):
            raise InvalidRequestError("The body must be a JSON-RPC 2.0 request")
        params = data.get("params")
        if params is not None and not isinstance(params, dict):
            raise InvalidParamsError("params must be an object")
        self.traced_as(method)
        self.traced.set("jsonrpc.request.id", str(self.request_id))
        if method in STREAMING:
            return self.stream(method, parse(STREAMING[method], params))
        if method == "GetExtendedAgentCard":
            raise ExtendedAgentCardNotConfiguredError()
        if method not in METHODS:
            raise MethodNotFoundError(f"Method not found: {method}")
        cls, handler = METHODS[method]
        result = handler(self.call, parse(cls, params))
        out = json_format.MessageToDict(result) if result is not None else {}
        return JsonResponse({"jsonrpc": "2.0", "id": self.request_id, "result": out})

    def stream(self, method: str, req):
        sent = held = None
        if method == "SubscribeToTask":
            task = service.find_task(self.call, req.id)
            if task.status in stream.ENDS - {"waiting_for_input"}:
                raise UnsupportedOperationError(f"Task {task.id} has ended ({task.status})")
            task_id = task.id
        else:
            held, sent = self.send_streamed(req)
            if sent.task is None:  # rejected: the one event is the task
                held.release()
                return self._single(sent.message)
            task_id = sent.task.id
        request_id = self.request_id

        def frame(result: dict) -> str:
            return f"data: {_json({'jsonrpc': '2.0', 'id': request_id, 'result': result})}\n\n"

        def error_frame(exc) -> str:
            error = translate(exc)
            if not isinstance(error, A2AError):
                error = InternalError("An unexpected error occurred")
            return f"event: error\ndata: {_json(build_error_response(request_id, error))}\n\n"

        return self.streaming(task_id, frame, error_frame, sent, held)

    def _single(self, task_message):
        result = json_format.MessageToDict(pb.StreamResponse(task=task_message))
        payload = {"jsonrpc": "2.0", "id": self.request_id, "result": result}
        return HttpResponse(f"data: {_json(payload)}\n\n", content_type="text/event-stream")


# --- HTTP+JSON ---------------------------------------------------------------------------------


# The A2A method each route and verb of the HTTP+JSON binding serves, for its span's name.
REST_METHODS = {
    ("POST", "send"): "SendMessage",
    ("POST", "stream"): "SendStreamingMessage",
    ("GET", "task"): "GetTask",
    ("GET", "tasks"): "ListTasks",
    ("POST", "cancel"): "CancelTask",
    ("GET", "subscribe"): "SubscribeToTask",
    ("POST", "subscribe"): "SubscribeToTask",
    ("POST", "configs"): "CreateTaskPushNotificationConfig",
    ("GET", "configs"): "ListTaskPushNotificationConfigs",
    ("GET", "config"): "GetTaskPushNotificationConfig",
    ("DELETE", "config"): "DeleteTaskPushNotificationConfig",
    ("GET", "extendedAgentCard"): "GetExtendedAgentCard",
}


class RestView(A2AView):
    """<mount>/a2a/<agentId>/rest/…: the HTTP+JSON binding, one view per operation (`op`)."""

    binding = REST
    op = ""
    http_method_names = ["get", "post", "delete"]

    def a2a_error(self, error):
        if isinstance(error, JSONParseError):  # JSON-RPC's own code; here a bad request
            error = InvalidRequestError(error.message)
        mapping = A2A_ERROR_MAPPING.get(type(error))
        status = mapping.http_code if mapping else 500
        return HttpResponse(
            _json(build_rest_error_payload(error)), status=status, content_type=A2A_JSON_MEDIA_TYPE
        )

    def answer(self, message, status=200) -> HttpResponse:
        content = _json(json_format.MessageToDict(message)) if message is not None else "{}"
        return HttpResponse(content, status=status, content_type=A2A_JSON_MEDIA_TYPE)

    def read(self, cls):
        data = api_body.parse(self.request)
        return parse(cls, data or {})

    def query(self, cls):
        message = cls()
        check_enums(cls, self.request.query_params)
        try:
            parse_params(self.request.query_params, message)
        except (json_format.ParseError, TypeError, ValueError) as exc:
            raise InvalidParamsError(str(exc)) from None
        return message

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self.traced_as(REST_METHODS.get((request.method, self.op), self.op))

    def get(self, request, agentId, taskId=None, configId=None):
        if self.op == "task":
            req = self.query(pb.GetTaskRequest)
            req.id = taskId
            return self.answer(service.get_task(self.call, req))
        if self.op == "tasks":
            return self.answer(service.list_tasks(self.call, self.query(pb.ListTasksRequest)))
        if self.op == "configs":
            req = pb.ListTaskPushNotificationConfigsRequest(task_id=taskId)
            return self.answer(service.list_push_configs(self.call, req))
        if self.op == "config":
            req = pb.GetTaskPushNotificationConfigRequest(task_id=taskId, id=configId)
            return self.answer(service.get_push_config(self.call, req))
        if self.op == "subscribe":
            return self.subscribe(taskId)
        if self.op == "extendedAgentCard":
            raise ExtendedAgentCardNotConfiguredError()
        raise MethodNotFoundError(f"Method {request.method} is not allowed on {request.path}")

    def post(self, request, agentId, taskId=None, configId=None):
        if self.op == "send":
            return self.answer(service.send_message(self.call, self.read(pb.SendMessageRequest)))
        if self.op == "stream":
            held, sent = self.send_streamed(self.read(pb.SendMessageRequest))
            if sent.task is None:
                held.release()
                result = json_format.MessageToDict(pb.StreamResponse(task=sent.message))
                return HttpResponse(f"data: {_json(result)}\n\n", content_type="text/event-stream")
            return self.streaming(sent.task.id, self.frame, self.error_frame, sent, held)
        if self.op == "cancel":
            self.read(pb.CancelTaskRequest)
            return self.answer(service.cancel_task(self.call, pb.CancelTaskRequest(id=taskId)))
        if self.op == "subscribe":
            return self.subscribe(taskId)
        if self.op == "configs":
            req = self.read(pb.TaskPushNotificationConfig)
            req.task_id = taskId
            return self.answer(service.create_push_config(self.call, req))
        raise MethodNotFoundError(f"Method {request.method} is not allowed on {request.path}")

    def delete(self, request, agentId, taskId=None, configId=None):
        if self.op == "config":
            req = pb.DeleteTaskPushNotificationConfigRequest(task_id=taskId, id=configId)
            service.delete_push_config(self.call, req)
            return self.answer(None)
        raise MethodNotFoundError(f"Method {request.method} is not allowed on {request.path}")

    def subscribe(self, task_id: str):
        task = service.find_task(self.call, task_id)
        if task.status in stream.ENDS - {"waiting_for_input"}:
            raise UnsupportedOperationError(f"Task {task.id} has ended ({task.status})")
        return self.streaming(task.id, self.frame, self.error_frame)

    @staticmethod
    def frame(result: dict) -> str:
        return f"data: {_json(result)}\n\n"

    @staticmethod
    def error_frame(exc) -> str:
        error = translate(exc)
        if not isinstance(error, A2AError):
            error = InternalError("An unexpected error occurred")
        return f"event: error\ndata: {_json(build_rest_error_payload(error))}\n\n"
