"""The routes of LangGraph's Agent Server API (docs/langgraph.md#routes): each maps onto
`agenttasks.lifecycle`, under the app's policies, and answers in LangGraph's shapes.

Errors are LangGraph's `{"detail": message}` with the REST API's status (another user's thread
or run is 404, never 403, on every route).
"""

from typing import Any

from django.apps import apps
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.response import Response

from .. import __version__, lifecycle
from ..conf import app_settings
from ..lifecycle import schedules
from ..models import Conversation, Event, Run, Schedule
from ..states import RUN_ENDED, MultitaskStrategy, RunStatus
from ..toolkit import body, caps, errors
from ..toolkit.identity import owner_id, user_of
from ..toolkit.policies import AppPolicies
from ..toolkit.streams import serve
from . import inputs, shapes
from .stream import RunStream

# A run has settled for `runs.wait` and `join` when it ended or stopped at an interrupt.
SETTLED = RUN_ENDED | {RunStatus.PAUSED}
NOT_SUPPORTED = "{what} is not supported by agenttasks (docs/langgraph.md#not-supported)"


def handle(exc, context) -> Response:
    """Answer an exception as LangGraph's server does: `{"detail": message}`."""
    response = errors.handle(exc, context)
    error = (response.data or {}).get("error") or {}
    return Response(
        {"detail": error.get("message", "")},
        status=response.status_code,
        headers={
            k: v for k, v in response.items() if k.lower() in ("retry-after", "www-authenticate")
        },
    )


def not_found(what: str) -> errors.ApiError:
    return errors.ApiError(404, "NOT_FOUND", f"{what} not found")


class ApiKeyAuthentication(BaseAuthentication):
    """`X-Api-Key: <token>`, as LangGraph's clients send their key (Agent Chat UI, the SDK's
    `api_key`): a DRF token of the site (`rest_framework.authtoken`), when the site has them."""

    def authenticate(self, request):
        key = request.headers.get("X-Api-Key")
        if not key or not apps.is_installed("rest_framework.authtoken"):
            return None
        from rest_framework.authtoken.models import Token  # only where the app is installed

        token = Token.objects.select_related("user").filter(key=key).first()
        if token is None or not token.user.is_active:
            raise AuthenticationFailed("Invalid API key.")
        return token.user, token


class LangGraphView(AppPolicies):
    """A route of the LangGraph API: the app's policies, LangGraph's errors, and lookups that
    answer 404 for what the principal does not own."""

    http_method_names = ["get", "post", "patch", "delete", "head"]

    def get_authenticators(self):
        return [ApiKeyAuthentication(), *super().get_authenticators()]

    def get_exception_handler(self):
        return handle

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        parsed = body.parse(request) if request.method in ("POST", "PATCH", "DELETE") else None
        if parsed is not None and not isinstance(parsed, dict):
            raise inputs.invalid("The body must be a JSON object")
        self.body: dict[str, Any] = parsed or {}

    def stream_location(self, thread_id: str, run_id: str) -> str:
        """The path of a run's stream (join_stream), under this request's mount."""
        mount = self.request.path.split("/langgraph/", 1)[0]
        return f"{mount}/langgraph/threads/{thread_id}/runs/{run_id}/stream"

    def agent(self, value: Any):
        found = shapes.find_assistant(str(value)) if isinstance(value, str) else None
        if found is None:
            raise not_found(f"Assistant {value}")
        return found

    def thread(self, thread_id: str) -> Conversation:
        conversation = (
            Conversation.objects.visible().filter(pk=thread_id).first()
            if "\x00" not in thread_id
            else None
        )
        if conversation is None or conversation.owner_id != owner_id(self.request):
            raise not_found(f"Thread {thread_id}")
        return conversation

    def run(self, conversation: Conversation, run_id: str) -> Run:
        found = (
            Run.objects.filter(pk=run_id, conversation_id=conversation.id)
            .exclude(status=RunStatus.ROLLED_BACK)
            .first()
            if "\x00" not in run_id
            else None
        )
        if found is None:
            raise not_found(f"Run {run_id}")
        return found


# --- info and assistants ---------------------------------------------------------------------


class InfoView(LangGraphView):
    def get(self, request):
        flags = {"assistants": True, "crons": True, "langsmith": False, "store": False}
        return Response({"version": f"agenttasks {__version__}", "flags": flags})


class AssistantSearchView(LangGraphView):
    def post(self, request):
        wanted = self.body.get("graph_id")
        metadata = self.body.get("metadata") or {}
        found = [
            shapes.assistant(agent)
            for agent in shapes.served()
            if (not wanted or agent.id == wanted)
            and all(shapes.assistant(agent)["metadata"].get(k) == v for k, v in metadata.items())
        ]
        offset, limit = inputs.page(self.body)
        return Response(found[offset : offset + limit])


class AssistantView(LangGraphView):
    def get(self, request, assistant_id):
        return Response(shapes.assistant(self.agent(assistant_id)))


class AssistantSchemasView(LangGraphView):
    def get(self, request, assistant_id):
        return Response(shapes.schemas(self.agent(assistant_id)))


class AssistantGraphView(LangGraphView):
    def get(self, request, assistant_id):
        return Response(shapes.graph(self.agent(assistant_id)))


# --- threads ---------------------------------------------------------------------------------


class ThreadsView(LangGraphView):
    def post(self, request):
        metadata = inputs.metadata(self.body)
        thread_id = self.body.get("thread_id")
        graph_id = self.body.get("graph_id")
        agent = self.agent(graph_id) if graph_id else None
        if thread_id is not None:
            existing = Conversation.objects.filter(pk=str(thread_id)).first()
            if existing is not None:
                if (
                    existing.owner_id == owner_id(request)
                    and self.body.get("if_exists") == "do_nothing"
                ):
                    return Response(shapes.thread(existing))
                raise errors.ApiError(409, "conflict", f"Thread {thread_id} already exists")
            raise inputs.invalid("thread_id is chosen by agenttasks: leave it out")
        conversation = lifecycle.create_conversation(
            owner=user_of(request),
            agent_id=agent.id if agent else "",
            metadata={**metadata, **({"graph_id": agent.id} if agent else {})},
        )
        return Response(shapes.thread(conversation))


class ThreadSearchView(LangGraphView):
    def post(self, request):
        rows = Conversation.objects.visible().filter(owner_id=owner_id(request))
        for key, value in inputs.metadata(self.body).items():
            if not key.isidentifier() or "__" in key:
                raise inputs.invalid(f"metadata key {key!r} cannot be searched")
            rows = rows.filter(**{f"metadata__{key}": value})
        ids = self.body.get("ids")
        if isinstance(ids, list):
            rows = rows.filter(pk__in=[str(i) for i in ids])
        order = "updated_at" if self.body.get("sort_by") == "updated_at" else "created_at"
        if self.body.get("sort_order") != "asc":
            order = "-" + order
        offset, limit = inputs.page(self.body)
        status = self.body.get("status")
        found = []
        for conversation in rows.order_by(order, "-id"):
            shown = shapes.thread(conversation)
            if status and shown["status"] != status:
                continue
            found.append(shown)
            if len(found) >= offset + limit:
                break
        return Response(found[offset:])


class ThreadView(LangGraphView):
    def get(self, request, thread_id):
        return Response(shapes.thread(self.thread(thread_id)))

    def patch(self, request, thread_id):
        conversation = self.thread(thread_id)
        merged = {**(conversation.metadata or {}), **inputs.metadata(self.body)}
        updated = lifecycle.update_conversation(conversation.id, metadata=merged)
        return Response(shapes.thread(updated))

    def delete(self, request, thread_id):
        lifecycle.delete_conversation(self.thread(thread_id).id)
        return Response(status=204)


class ThreadStateView(LangGraphView):
    def get(self, request, thread_id):
        return Response(shapes.state(self.thread(thread_id)))

    def post(self, request, thread_id):
        raise inputs.invalid(NOT_SUPPORTED.format(what="Updating a thread's state"))


class ThreadHistoryView(LangGraphView):
    """The thread's state after each of its runs, newest first."""

    def get(self, request, thread_id):
        return self.history(thread_id, int(request.query_params.get("limit", 10) or 10))

    def post(self, request, thread_id):
        return self.history(thread_id, inputs.page(self.body, default=10)[1])

    def history(self, thread_id: str, limit: int) -> Response:
        conversation = self.thread(thread_id)
        states = [shapes.state(conversation)]
        ends = (
            Run.objects.filter(conversation_id=conversation.id, status__in=RUN_ENDED)
            .exclude(status=RunStatus.ROLLED_BACK)
            .order_by("-ended_at", "-id")
        )
        for run in ends[: max(limit - 1, 0)]:
            through = (
                Event.objects.filter(conversation_id=conversation.id, run_id=run.id)
                .order_by("-seq")
                .values_list("seq", flat=True)
                .first()
            )
            if through is not None and through < conversation.last_seq:
                states.append(shapes.state(conversation, through=through))
        states = states[:limit]
        # Each state's parent is the one before it, so clients walk one line of checkpoints
        # (useStream takes the head of the branch it builds from these links).
        for newer, older in zip(states, states[1:], strict=False):
            newer["parent_checkpoint"] = older["checkpoint"]
        return Response(states)


class ThreadCopyView(LangGraphView):
    """A copy of the thread's messages in a new thread of the same assistant (no runs come)."""

    def post(self, request, thread_id):
        copied = lifecycle.copy_conversation(self.thread(thread_id).id, owner=user_of(request))
        return Response(shapes.thread(copied))


# --- runs ------------------------------------------------------------------------------------


class RunsView(LangGraphView):
    """POST creates a run in the background (`pending` at once); GET lists the thread's runs."""

    mode = "background"  # or "wait", "stream"

    def get(self, request, thread_id):
        conversation = self.thread(thread_id)
        rows = (
            Run.objects.filter(conversation_id=conversation.id)
            .exclude(status=RunStatus.ROLLED_BACK)
            .order_by("-created_at", "-id")
        )
        limit = min(max(int(request.query_params.get("limit", 10) or 10), 1), 1000)
        offset = max(int(request.query_params.get("offset", 0) or 0), 0)
        status = request.query_params.get("status")
        shown = [shapes.run(r) for r in rows[offset : offset + limit]]
        return Response([r for r in shown if not status or r["status"] == status])

    def post(self, request, thread_id=None):
        if thread_id is None:
            conversation = None  # stateless: a thread of its own
        else:
            conversation = self.thread(thread_id)
        agent = self.agent(self.body.get("assistant_id"))
        head = shapes.checkpoint(conversation, conversation.last_seq) if conversation else None
        unsupported = inputs.unsupported(self.body, head["checkpoint_id"] if head else None)
        if unsupported:
            raise inputs.invalid(NOT_SUPPORTED.format(what=unsupported))
        if conversation is None:
            conversation = lifecycle.create_conversation(
                owner=user_of(request), agent_id=agent.id, metadata={"graph_id": agent.id}
            )
        else:
            lifecycle.adopt_agent(conversation.id, agent.id)
        run = start(conversation, self.body, user_of(request))
        if self.mode == "wait":
            return Response(waited(request, conversation, run))
        if self.mode == "stream":
            modes = inputs.stream_modes(self.body.get("stream_mode"))
            response = serve_stream(request, RunStream(conversation.id, run.id, modes))
            # Where the SDK reconnects (with Last-Event-ID) when the stream is cut before the end.
            response["Location"] = self.stream_location(conversation.id, run.id)
            response["Content-Location"] = response["Location"]
            return response
        return Response(shapes.run(run, agent.id))


def start(conversation: Conversation, data: dict, user) -> Run:
    """Start what a run's body asks: resume the thread's interrupt (`command.resume`), or post
    its input messages as one user message under the run's multitask strategy."""
    command = data.get("command") or {}
    if not isinstance(command, dict):
        raise inputs.invalid("command must be an object")
    if "resume" in command:
        return inputs.resume(conversation, command["resume"], user)
    text = inputs.text(data.get("input"))
    strategy = data.get("multitask_strategy") or MultitaskStrategy.ENQUEUE
    metadata = inputs.metadata(data)
    configurable = (data.get("config") or {}).get("configurable")
    if isinstance(configurable, dict) and configurable:
        # Kept with the message, where the agent reads its run's metadata (ctx.metadata).
        metadata = inputs.metadata({"metadata": {**metadata, "configurable": configurable}})
    run, _ = lifecycle.post_message(
        conversation.id, text, author=user, metadata=metadata or None, strategy=strategy
    )
    return run


def serve_stream(request, stream: RunStream):
    """Serve a run's stream in one of the principal's stream places, as REST's streams are."""
    stream.held = caps.take(
        request, caps.STREAM, app_settings.MAX_STREAMS_PER_USER, app_settings.SLOT_LEASE_SECONDS
    )
    stream.client_fd = caps.client_socket(request._request)  # None under ASGI
    return serve(stream, request._request)


def waited(request, conversation: Conversation, run: Run) -> dict:
    """What `runs.wait` and `join` answer: the thread's values once the run settled, with
    `__interrupt__` when it stopped at one and `__error__` when it failed. The wait holds one of
    the principal's wait places, as REST's `/wait` does."""
    wait = float(app_settings.MAX_STATUS_WAIT)
    held = caps.take(
        request, caps.WAIT, app_settings.MAX_WAITS_PER_USER, wait + app_settings.SLOT_LEASE_SECONDS
    )
    try:
        ended = lifecycle.wait_for_run(run.id, wait=wait, settled=SETTLED)
    finally:
        held.release()
    out: dict[str, Any] = shapes.values(conversation.id)
    if ended.status == RunStatus.PAUSED:
        out["__interrupt__"] = shapes.interrupts(conversation.id)
    elif ended.status == RunStatus.FAILED:
        out["__error__"] = {"error": "RunError", "message": ended.error}
    return out


class RunWaitView(RunsView):
    mode = "wait"


class RunStreamView(RunsView):
    mode = "stream"


class RunView(LangGraphView):
    def get(self, request, thread_id, run_id):
        conversation = self.thread(thread_id)
        return Response(shapes.run(self.run(conversation, run_id)))

    def delete(self, request, thread_id, run_id):
        run = self.run(self.thread(thread_id), run_id)
        if not lifecycle.delete_run(run.id):
            raise errors.ApiError(
                409, "conflict", f"Run {run_id} has not ended (or is a task's): cancel it first"
            )
        return Response(status=204)


class RunJoinView(LangGraphView):
    def get(self, request, thread_id, run_id):
        conversation = self.thread(thread_id)
        return Response(waited(request, conversation, self.run(conversation, run_id)))


class RunJoinStreamView(LangGraphView):
    def get(self, request, thread_id, run_id):
        conversation = self.thread(thread_id)
        run = self.run(conversation, run_id)
        modes = inputs.stream_modes(request.query_params.getlist("stream_mode") or None)
        resume = inputs.last_event_id(request)
        stream = RunStream(conversation.id, run.id, modes, after=resume, joined=True)
        return serve_stream(request, stream)


class RunCancelView(LangGraphView):
    def post(self, request, thread_id, run_id):
        conversation = self.thread(thread_id)
        run = self.run(conversation, run_id)
        action = request.query_params.get("action") or "interrupt"
        if action not in ("interrupt", "rollback"):
            raise inputs.invalid("action must be interrupt or rollback")
        lifecycle.stop_run(run.id, rollback=action == "rollback")
        if request.query_params.get("wait") in ("1", "true", "True"):
            lifecycle.wait_for_run(
                run.id, wait=float(app_settings.MAX_STATUS_WAIT), settled=RUN_ENDED
            )
        return Response(status=202 if request.query_params.get("wait") in (None, "0") else 204)


# --- crons: schedules ------------------------------------------------------------------------


class CronsView(LangGraphView):
    """POST creates a cron: on a thread, each tick posts the input there (strategy enqueue);
    stateless, each tick creates a task of the assistant. A schedule underneath
    (docs/lifecycle.md#schedules); LangGraph's 5-field cron gets a seconds field of 0."""

    def post(self, request, thread_id=None):
        conversation = self.thread(thread_id) if thread_id is not None else None
        agent = self.agent(self.body.get("assistant_id"))
        if conversation is not None:
            lifecycle.adopt_agent(conversation.id, agent.id)
        schedule = inputs.cron(self.body.get("schedule"))
        created = schedules.create_schedule(
            owner=user_of(request),
            input=inputs.text(self.body.get("input")),
            agent_id=agent.id,
            cron=schedule,
            timezone=self.body.get("timezone") or "UTC",
            metadata=inputs.metadata(self.body),
            conversation_id=conversation.id if conversation is not None else None,
            strategy=self.body.get("multitask_strategy") or MultitaskStrategy.ENQUEUE,
            paused=self.body.get("enabled") is False,
        )
        return Response(shapes.cron(created))


class CronSearchView(LangGraphView):
    def post(self, request):
        rows = Schedule.objects.filter(owner_id=owner_id(request)).order_by("-created_at", "-id")
        if self.body.get("thread_id"):
            rows = rows.filter(conversation_id=str(self.body["thread_id"]))
        wanted = self.body.get("assistant_id")
        if wanted:
            rows = rows.filter(agent=self.agent(wanted).id)
        offset, limit = inputs.page(self.body)
        return Response([shapes.cron(r) for r in rows[offset : offset + limit]])


class CronView(LangGraphView):
    def schedule(self, cron_id: str) -> Schedule:
        found = Schedule.objects.filter(pk=cron_id, owner_id=owner_id(self.request)).first()
        if found is None:
            raise not_found(f"Cron {cron_id}")
        return found

    def patch(self, request, cron_id):
        schedule = self.schedule(cron_id)
        changes: dict[str, Any] = {}
        if "schedule" in self.body:
            changes["cron"] = inputs.cron(self.body["schedule"])
        if "timezone" in self.body:
            changes["timezone"] = self.body["timezone"]
        if "input" in self.body:
            changes["input"] = inputs.text(self.body["input"])
        if "metadata" in self.body:
            changes["metadata"] = inputs.metadata(self.body)
        if changes:
            schedule = schedules.update_schedule(schedule.id, **changes)
        if self.body.get("enabled") is False:
            schedule = schedules.pause_schedule(schedule.id)
        elif self.body.get("enabled") is True:
            schedule = schedules.resume_schedule(schedule.id)
        return Response(shapes.cron(schedule))

    def delete(self, request, cron_id):
        schedules.delete_schedule(self.schedule(cron_id).id)
        return Response(status=204)


class NotSupportedView(LangGraphView):
    """A route of LangGraph's API with no agenttasks equivalent (the store, crons for now)."""

    what = "This route"

    def get(self, request, *args, **kwargs):
        raise errors.ApiError(404, "NOT_FOUND", NOT_SUPPORTED.format(what=self.what))

    post = put = patch = delete = get
