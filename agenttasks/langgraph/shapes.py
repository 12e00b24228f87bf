"""What LangGraph's API answers, built from agenttasks' rows (docs/langgraph.md#the-mapping).

- An assistant is an exposed agent: `graph_id` its id, `assistant_id` a UUID derived from it.
- A thread is a conversation: `values` are `{"messages": [...]}` in LangChain's serialized
  message shape, read from the conversation's message events; its status is read from its runs
  and pending actions.
- A run is a run of the conversation, its status in LangGraph's names.
- An interrupt is a pending approval or question: its id is the action's, its value names the
  action.
"""

import uuid
from typing import Any

from .. import registry
from ..models import Conversation, Event, PendingAction, Run
from ..states import RunStatus
from ..store import pending_actions_below

NAMESPACE = uuid.UUID("6c6f8f0e-4a3b-5d0c-9a51-6167656e7473")  # "agents", fixed forever
EPOCH = "1970-01-01T00:00:00+00:00"  # an agent registered in settings or code has no date
NODE = "agent"  # the one node an agenttasks agent is, as LangGraph names nodes
TRANSCRIPT = ("message.user", "message.assistant", "tool.result", "task.notification")

RUN_STATUS: dict[str, str] = {
    RunStatus.QUEUED: "pending",
    RunStatus.WAITING: "pending",
    RunStatus.RUNNING: "running",
    RunStatus.PAUSED: "success",  # it stopped at an interrupt: its thread is `interrupted`
    RunStatus.COMPLETED: "success",
    RunStatus.FAILED: "error",
    RunStatus.CANCELLED: "interrupted",
    RunStatus.INTERRUPTED: "interrupted",
}


def iso(value) -> str | None:
    return value.isoformat() if value is not None else None


# --- assistants ------------------------------------------------------------------------------


def assistant_id(agent_id: str) -> str:
    """Return the stable UUID of an agent's assistant."""
    return str(uuid.uuid5(NAMESPACE, agent_id))


def served() -> list[registry.AgentDef]:
    """Return the agents served as assistants: the exposed ones."""
    return [agent for agent in registry.agents() if agent.expose]


def find_assistant(value: str) -> registry.AgentDef | None:
    """Return the served agent named by its id (LangGraph's graph id) or its assistant UUID."""
    return next((a for a in served() if value in (a.id, assistant_id(a.id))), None)


def assistant(agent: registry.AgentDef) -> dict[str, Any]:
    return {
        "assistant_id": assistant_id(agent.id),
        "graph_id": agent.id,
        "name": agent.id,
        "description": agent.does or None,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "created_at": EPOCH,
        "updated_at": EPOCH,
    }


MESSAGES_SCHEMA = {
    "type": "object",
    "properties": {"messages": {"type": "array", "items": {"type": "object"}}},
    "required": ["messages"],
}


def schemas(agent: registry.AgentDef) -> dict[str, Any]:
    return {
        "graph_id": agent.id,
        "input_schema": MESSAGES_SCHEMA,
        "output_schema": MESSAGES_SCHEMA,
        "state_schema": MESSAGES_SCHEMA,
        "config_schema": None,
        "context_schema": None,
    }


def graph(agent: registry.AgentDef) -> dict[str, Any]:
    """An agent drawn as LangGraph draws a one-node graph."""
    nodes: list[dict[str, Any]] = [{"id": "__start__", "type": "schema", "data": "__start__"}]
    nodes += [{"id": NODE, "type": "runnable", "data": {"id": ["agenttasks", agent.id]}}]
    nodes += [{"id": "__end__", "type": "schema", "data": "__end__"}]
    edges = [{"source": "__start__", "target": NODE}, {"source": NODE, "target": "__end__"}]
    return {"nodes": nodes, "edges": edges}


# --- messages --------------------------------------------------------------------------------


def message(event: Event) -> dict[str, Any] | None:
    """Return a message event as a LangChain message (None: not one a reader sees)."""
    data = event.data or {}
    base: dict[str, Any] = {
        "id": event.id,
        "name": None,
        "additional_kwargs": {},
        "response_metadata": {},
    }
    if event.type in ("message.user", "task.notification"):
        return {**base, "type": "human", "content": data.get("content") or "", "example": False}
    if event.type == "message.assistant":
        calls = [
            {
                "name": call.get("function", {}).get("name", ""),
                "args": call.get("function", {}).get("arguments", {}),
                "id": call.get("id"),
                "type": "tool_call",
            }
            for call in data.get("toolCalls") or []
        ]
        usage = data.get("usage") or {}
        return {
            **base,
            "type": "ai",
            "content": data.get("content") or "",
            "example": False,
            "tool_calls": calls,
            "invalid_tool_calls": [],
            "usage_metadata": (
                {
                    "input_tokens": usage.get("inputTokens", 0),
                    "output_tokens": usage.get("outputTokens", 0),
                    "total_tokens": usage.get("totalTokens", 0),
                }
                if usage
                else None
            ),
        }
    if event.type == "tool.result":
        return {
            **base,
            "type": "tool",
            "content": data.get("content") or "",
            "tool_call_id": data.get("toolCallId"),
            "name": data.get("name"),
            "status": "error" if data.get("isError") else "success",
        }
    return None


def values(conversation_id: str, *, through: int | None = None) -> dict[str, Any]:
    """Return a thread's values: its messages (up to the event `through`, when given)."""
    events = Event.objects.filter(conversation_id=conversation_id, type__in=TRANSCRIPT)
    if through is not None:
        events = events.filter(seq__lte=through)
    messages = [message(e) for e in events.order_by("seq")]
    return {"messages": [m for m in messages if m is not None]}


# --- interrupts ------------------------------------------------------------------------------


def interrupt(action: PendingAction) -> dict[str, Any]:
    """Return a pending action as a LangGraph interrupt. Its value is in the shape of LangGraph's
    human-in-the-loop interrupts (`action_request`, `config`, `description`: what Agent Chat UI
    and Agent Inbox render with accept / ignore / respond), and names the action plainly too."""
    if action.kind == "approval":
        request = {"action": action.tool_name, "args": action.args or {}}
        config = {"allow_accept": True, "allow_ignore": True, "allow_respond": True}
        description = action.prompt or f"Approve {action.tool_name}?"
        plain = {"type": "approval", "tool": action.tool_name, "args": action.args or {}}
    else:
        questions = action.questions or []
        request = {
            "action": "question",
            "args": {q.get("id"): q.get("question") for q in questions},
        }
        config = {"allow_accept": False, "allow_ignore": False, "allow_respond": True}
        description = "\n".join(str(q.get("question", "")) for q in questions)
        plain = {"type": "question", "questions": questions}
    value = {
        "action_request": request,
        "config": {**config, "allow_edit": False},
        "description": description,
        "action_id": action.id,
        **plain,
    }
    return {"id": action.id, "value": value}


def interrupts(conversation_id: str) -> list[dict[str, Any]]:
    return [interrupt(a) for a in pending_actions_below(conversation_id)]


# --- threads and runs ------------------------------------------------------------------------


def thread_status(conversation_id: str) -> str:
    """idle, busy (a run queued, running or waiting its turn), interrupted (an action pending)
    or error (its latest run failed)."""
    if pending_actions_below(conversation_id).exists():
        return "interrupted"
    runs = Run.objects.filter(conversation_id=conversation_id).exclude(status=RunStatus.ROLLED_BACK)
    if runs.filter(status__in=(RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING)).exists():
        return "busy"
    latest = runs.order_by("-created_at", "-id").values_list("status", flat=True).first()
    return "error" if latest == RunStatus.FAILED else "idle"


def thread(conversation: Conversation) -> dict[str, Any]:
    pending = interrupts(conversation.id)
    latest = latest_run_id(conversation.id)
    return {
        "thread_id": conversation.id,
        "created_at": iso(conversation.created_at),
        "updated_at": iso(conversation.updated_at),
        "metadata": conversation.metadata or {},
        "status": thread_status(conversation.id),
        "values": values(conversation.id),
        "interrupts": {latest: pending} if pending and latest else {},
    }


def latest_run_id(conversation_id: str) -> str | None:
    return (
        Run.objects.filter(conversation_id=conversation_id)
        .exclude(status=RunStatus.ROLLED_BACK)
        .order_by("-created_at", "-id")
        .values_list("id", flat=True)
        .first()
    )


def checkpoint(conversation: Conversation, seq: int) -> dict[str, Any]:
    return {
        "thread_id": conversation.id,
        "checkpoint_ns": "",
        "checkpoint_id": f"{conversation.id}-{seq}",
        "checkpoint_map": None,
    }


def state(conversation: Conversation, *, through: int | None = None) -> dict[str, Any]:
    """Return a thread's state now (or as it was after event `through`)."""
    seq = through if through is not None else conversation.last_seq
    pending = interrupts(conversation.id) if through is None else []
    latest = latest_run_id(conversation.id)
    tasks = []
    if pending and latest:
        tasks = [
            {
                "id": latest,
                "name": NODE,
                "path": ["__pregel_pull", NODE],
                "error": None,
                "interrupts": pending,
                "checkpoint": None,
                "state": None,
                "result": None,
            }
        ]
    return {
        "values": values(conversation.id, through=through),
        "next": [NODE] if pending else [],
        "tasks": tasks,
        "interrupts": pending,
        "metadata": {**(conversation.metadata or {}), "step": seq},
        "created_at": iso(conversation.updated_at),
        "checkpoint": checkpoint(conversation, seq),
        "parent_checkpoint": None,
    }


def run(row: Run, agent_id: str | None = None) -> dict[str, Any]:
    return {
        "run_id": row.id,
        "thread_id": row.conversation_id,
        "assistant_id": assistant_id(agent_id or row.agent),
        "created_at": iso(row.created_at),
        "updated_at": iso(row.ended_at or row.started_at or row.queued_at or row.created_at),
        "status": RUN_STATUS.get(row.status, "pending"),
        "metadata": {},
        "kwargs": {},
        "multitask_strategy": "enqueue",
    }


def cron(schedule) -> dict[str, Any]:
    """A schedule as a LangGraph cron (its expression without the seconds field)."""
    return {
        "cron_id": schedule.id,
        "assistant_id": assistant_id(schedule.agent),
        "thread_id": schedule.conversation_id,
        "schedule": " ".join(schedule.cron.split()[1:]) if schedule.cron else "",
        "timezone": schedule.timezone,
        "payload": {"input": {"messages": [{"type": "human", "content": schedule.input}]}},
        "metadata": schedule.metadata or {},
        "enabled": not schedule.paused,
        "next_run_date": iso(schedule.next_run_at),
        "end_time": None,
        "on_run_completed": None,
        "user_id": str(schedule.owner_id),
        "created_at": iso(schedule.created_at),
        "updated_at": iso(schedule.updated_at),
    }
