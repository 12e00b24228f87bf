"""The MCP tools: the four background-task tools, `task_answer`, and one tool per exposed agent.

The task tools are the ones our own models get (`runtime/task_tools.py`): the same strict input
schemas, descriptions and result texts, bound to the client's conversation
(`sessions.Session`). What differs is said in docs/mcp.md#tools: `task_status` without a
`task_id` also hands over what finished since the last look (the wake-up debt, settled as the
model's own pull), and a task waiting for input shows what it asks; `spawn_task` takes only the
agents the server exposes.

An argument that does not fit a tool's schema, or that REST would refuse (a blank input, one over
MAX_INPUT_CHARS, metadata over MAX_METADATA_BYTES), is a protocol error (INVALID_PARAMS); a
refusal of the lifecycle is a tool result with `isError`, in the contract's words.
"""

from typing import Any

from .. import lifecycle, registry
from ..exceptions import (
    ActionNotFound,
    RunNotFound,
    SpawnError,
    TaskError,
    TaskNotFound,
)
from ..lifecycle import answers
from ..models import Comment, Conversation, PendingAction, Task
from ..runtime import task_tools as tt
from ..states import LIVE, TERMINAL, TaskKind, TaskStatus
from ..toolkit import checks, errors
from ..toolkit.checks import storable
from ..tools import InvalidArguments, check_arguments
from . import elicitation, protocol
from .sessions import Session

TASK_TOOLS = ("spawn_task", "task_status", "task_retry", "task_stop")
ANSWER = "task_answer"
ANSWER_DESCRIPTION = (
    "Answer a background task that is waiting for input (status input_required): an approval or "
    "a question it asked. task_status shows each pending action's id and what it asks. The "
    'answer is {"approved": true or false, "comment": "…"} for an approval, or {"answers": '
    '{"<question id>": "<value>"}} for a question (a list of values where it takes several).'
)
ANSWER_PARAMETERS = {
    "type": "object",
    "properties": {
        "action_id": {
            "type": "string",
            "description": "The pending action's id (act_…), as task_status shows it",
        },
        "answer": {
            "type": "object",
            "description": 'The answer: {"approved": bool, "comment": str} for an approval, '
            '{"answers": {"q1": "…"}} for a question',
        },
    },
    "required": ["action_id", "answer"],
    "additionalProperties": False,
}
ANNOTATIONS: dict[str, dict[str, bool]] = {
    "spawn_task": {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": True},
    "task_status": {"readOnlyHint": True, "openWorldHint": False},
    "task_retry": {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": True},
    "task_stop": {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": True,
        "openWorldHint": False,
    },
    ANSWER: {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False},
}
# An agent may do anything its tools do: it is not known to be read-only or harmless.
AGENT_ANNOTATIONS = {"readOnlyHint": False, "openWorldHint": True}

AGENT_PROPERTIES = {
    "input": {"type": "string", "description": "What the agent is asked to do"},
    "label": {
        "type": "string",
        "description": "A short label for the task (default: the start of the input)",
    },
    "metadata": {
        "type": "object",
        "description": "JSON metadata kept with the task, as the REST API takes it",
    },
    "priority": {
        "type": "integer",
        "minimum": -100,
        "maximum": 100,
        "description": "Higher first, within each owner's share of the workers (default 0)",
    },
    "notBefore": {
        "type": "string",
        "format": "date-time",
        "description": "Start no earlier than this (ISO 8601 with an offset)",
    },
}
AGENT_PARAMETERS = {
    "type": "object",
    "properties": AGENT_PROPERTIES,
    "required": ["input"],
    "additionalProperties": False,
}
STATUSES = [str(v) for v in TaskStatus]
AGENT_OUTPUT = {
    "type": "object",
    "properties": {
        "taskId": {"type": "string"},
        "status": {"type": "string", "enum": STATUSES},
        "result": {"type": "string"},
        "error": {"type": "string"},
        "progress": {"type": "string"},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "name": {"type": "string"},
                    "mimeType": {"type": "string"},
                    "size": {"type": "integer"},
                    "uri": {"type": "string"},
                },
            },
        },
    },
    "required": ["taskId", "status"],
}


# --- the catalogue -----------------------------------------------------------------------------


def served_agents() -> list[registry.AgentDef]:
    """Return the agents served as tools: exposed, not opted out, not named like a task tool."""
    reserved = {*TASK_TOOLS, ANSWER}
    return [a for a in registry.agents() if a.expose and a.mcp and a.id not in reserved]


def served_agent(name: str) -> registry.AgentDef | None:
    return next((a for a in served_agents() if a.id == name), None)


def catalogue() -> list[dict]:
    """Return every tool, as tools/list describes it."""
    out = []
    for spec in tt.task_tools(None):
        parameters = (
            _served_spawn(spec.parameters) if spec.name == "spawn_task" else spec.parameters
        )
        out.append(_entry(spec.name, spec.description, parameters, ANNOTATIONS[spec.name]))
    out.append(_entry(ANSWER, ANSWER_DESCRIPTION, ANSWER_PARAMETERS, ANNOTATIONS[ANSWER]))
    for agent in served_agents():
        description = agent.does or f"Run the {agent.name} agent on an input"
        entry = _entry(agent.id, description, AGENT_PARAMETERS, AGENT_ANNOTATIONS)
        entry["title"] = agent.name
        entry["outputSchema"] = AGENT_OUTPUT
        out.append(entry)
    return out


def _served_spawn(parameters: dict) -> dict:
    """spawn_task's parameters as MCP serves them: a host has no current agent to default to, so
    agent_name names one of the served agents."""
    names = ", ".join(a.id for a in served_agents()) or "(none)"
    agent_name = {
        **parameters["properties"]["agent_name"],
        "description": f"Agent to run the task with, one of: {names}",
    }
    return {**parameters, "properties": {**parameters["properties"], "agent_name": agent_name}}


def _entry(name: str, description: str, parameters: dict, annotations: dict) -> dict:
    return {
        "name": name,
        "description": description,
        "inputSchema": parameters,
        "annotations": annotations,
    }


def instructions() -> str:
    """Return the server's instructions: what the tools are for, and the agents spawn_task takes."""
    agents = ", ".join(f"{a.id} ({a.does})" if a.does else a.id for a in served_agents())
    return (
        "Durable background tasks (agenttasks). spawn_task starts a task and returns its id at "
        "once; task_status follows it (without a task_id it lists this conversation's tasks and "
        "what finished since you last looked), task_answer answers its questions, task_retry "
        "resumes a failed one, task_stop stops one. Each agent is also a tool of its own that "
        "runs it and answers with its result. spawn_task's agent_name is one of: "
        f"{agents or '(none)'}."
    )


# --- arguments ---------------------------------------------------------------------------------


def check(name: str, arguments: Any) -> dict:
    """Return the call's arguments when they fit the tool's schema (INVALID_PARAMS otherwise)."""
    arguments = {} if arguments is None else arguments
    if name in TASK_TOOLS:
        parameters, strict = next(t for t in tt.task_tools(None) if t.name == name).parameters, True
    elif name == ANSWER:
        parameters, strict = ANSWER_PARAMETERS, True
    else:
        parameters, strict = AGENT_PARAMETERS, False
        if isinstance(arguments, dict):  # no other properties, as the schema says
            unknown = sorted(set(arguments) - set(AGENT_PROPERTIES))
            if unknown:
                raise protocol.invalid_params(
                    InvalidArguments("unknown", unknown[0]).tool_text(name)
                )
    try:
        return check_arguments(arguments, parameters, strict=strict)
    except InvalidArguments as exc:
        raise protocol.invalid_params(exc.tool_text(name)) from None


def rest_checked(check_fn, *args, **kwargs):
    """Run one of REST's checks; its refusal is INVALID_PARAMS with REST's message."""
    try:
        return check_fn(*args, **kwargs)
    except errors.ApiError as exc:
        raise protocol.invalid_params(exc.message) from None


def check_label(label: str) -> None:
    if label and len(label) > 200:
        raise protocol.invalid_params("label must be a string of 1 to 200 characters")
    rest_checked(storable, label, "label")


def waits(name: str, args: dict) -> bool:
    """Say whether a (checked) call may wait: an agent's, or task_status with wait_seconds."""
    if name == "task_status":
        return bool(args.get("task_id")) and args.get("wait_seconds", 0) > 0
    return name not in TASK_TOOLS and name != ANSWER


# --- results -----------------------------------------------------------------------------------


def text_result(text: str, *, is_error: bool = False, structured: dict | None = None) -> dict:
    out: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if structured is not None:
        out["structuredContent"] = structured
    return out


def from_tool(result) -> dict:
    return text_result(result.text, is_error=result.is_error)


def error_result(exc_or_text) -> dict:
    return from_tool(tt.tool_error(exc_or_text))


def waiting_text(task: Task) -> str:
    """Return what a task waiting for input asks, and how to answer it."""
    actions = list(
        PendingAction.objects.filter(pk__in=lifecycle.waiting_on(task)).order_by("created_at", "id")
    )
    if actions:
        return elicitation.describe(actions)
    return (
        f"waiting for input: {question(task)}\n"
        f"(a clarification: comment on the task over REST, POST /tasks/{task.id}/comments)"
    )


def question(task: Task) -> str:
    """Return a legacy clarification's question: the agent's reply, answered by a comment."""
    asked = (
        Comment.objects.filter(task_id=task.id, role=Comment.Role.AGENT)
        .order_by("-created_at")
        .values_list("content", flat=True)
        .first()
    )
    return asked or task.summary


# --- the task tools ----------------------------------------------------------------------------


class TaskTools:
    """The task tools of one session, for one request."""

    def __init__(self, session: Session, request_id: Any, stop_check=None):
        self.session = session
        self.tool_call_id = str(request_id)
        self.stop_check = stop_check
        self.specs = {t.name: t for t in tt.task_tools(session.conversation_id)}

    def call(self, name: str, args: dict) -> dict:
        if name == "spawn_task":
            return self.spawn(args)
        if name == "task_status":
            return self.status(args)
        if name == ANSWER:
            return self.answer(args)
        try:
            task = self.owned(args["task_id"])
        except TaskError as exc:
            return error_result(exc)
        # The tool as bound to the session that spawned the task (maybe an earlier one).
        spec = next(t for t in tt.task_tools(task.parent_conversation_id) if t.name == name)
        return from_tool(spec.run(args, self.tool_call_id))

    def owned(self, task_id: str) -> Task:
        """Return a task of the caller's sessions; any other (another user's) does not exist."""
        task = (
            Task.objects.select_related("run")
            .filter(parent_conversation_id__in=self.reachable())
            .exclude(kind=TaskKind.DELEGATE)
            .named(task_id)
        )
        if task is None:
            raise TaskNotFound(task_id)
        return task

    def reachable(self) -> Any:
        """Return the conversations whose tasks the caller reaches by id: those of all its
        sessions, so a host that opens a session per call finds its tasks again; the listing
        stays the session's (docs/mcp.md#sessions). An anonymous caller reaches its session's."""
        user = self.session.caller.user
        if user is None:
            return [self.session.conversation_id]
        return Conversation.objects.filter(owner=user, agent="", hidden=True).values("id")

    def spawn(self, args: dict) -> dict:
        rest_checked(checks.text, args["input"], "input", required_message="input is required")
        check_label(args["label"])
        name = args["agent_name"]
        if served_agent(name) is None:
            # An agent the server does not expose reads as one that does not exist.
            unknown = registry.UnknownAgent(f"unknown agent {name!r}")
            return error_result(SpawnError.resolving_agent(name, unknown))
        try:
            self.session.conversation()
        except TaskError as exc:
            return error_result(exc)
        return from_tool(self.specs["spawn_task"].run(args, self.tool_call_id))

    def status(self, args: dict) -> dict:
        if not args["task_id"]:
            conversation = self.session.conversation_id
            owed = lifecycle.take_owed(conversation) if self.session.started() else ""
            text = tt.listing(lifecycle.list_tasks(conversation))
            return text_result(f"{owed}\n\n{text}" if owed else text)
        try:
            task = self.owned(args["task_id"])
            info = lifecycle.status(
                task.id,
                wait=max(args["wait_seconds"], 0),
                stop_check=self.stop_check,
                settled=TERMINAL,  # as the model tool waits (docs/lifecycle.md#status-and-waiting)
            )
        except TaskError as exc:
            return error_result(exc)
        lifecycle.model_has_result(info)
        text = tt.tool_result(tt.unnamed(info)).text
        if info.status == TaskStatus.WAITING_FOR_INPUT:
            text += "\n" + waiting_text(Task.objects.select_related("run").get(pk=task.id))
        return text_result(text)

    def answer(self, args: dict) -> dict:
        action_id = args["action_id"]
        action, task = self.answerable(action_id)
        if action is None or task is None:
            return error_result(errors.refusal(ActionNotFound(action_id)).message)
        try:
            resolution = answers.checked(action, args["answer"])
        except answers.AnswerError as exc:
            return error_result(exc.message)
        try:
            lifecycle.resolve_as_person(
                action.id, {**resolution, "decided_by": self.session.caller.user}
            )
        except (ActionNotFound, TaskNotFound, RunNotFound):
            return error_result(errors.refusal(ActionNotFound(action_id)).message)
        except TaskError as exc:
            return error_result(errors.refusal(exc).message)
        action.refresh_from_db()
        info = lifecycle.info(Task.objects.select_related("run").get(pk=task.id))
        return text_result(f"action {action.id}: {action.status}\n" + tt.describe(tt.unnamed(info)))

    def answerable(self, action_id: str) -> tuple[PendingAction | None, Task | None]:
        """Return the action and the session's task it holds up (its own, or one it escalated to)."""
        if "\x00" in action_id:
            return None, None
        action = PendingAction.objects.select_related("task").filter(pk=action_id).first()
        if action is None:
            return None, None
        if action.task is not None:
            try:
                return action, self.owned(action.task.id)
            except TaskNotFound:
                pass
        waiting = Task.objects.select_related("run").filter(
            parent_conversation_id__in=self.reachable(), status__in=LIVE
        )
        for task in waiting.exclude(kind=TaskKind.DELEGATE):
            if action.id in lifecycle.waiting_on(task):
                return action, task
        return action, None
