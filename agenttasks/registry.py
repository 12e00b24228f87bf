"""The agent registry: definitions from AGENTTASKS["AGENTS"] and from register(), by id.

It stands below the lifecycle and the runtimes (it imports neither): both look agents up here.
"""

import re
import threading
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .conf import app_settings
from .tools import DEFAULT_PARAMETERS, ToolSpec

ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
RUNTIMES = ("chat", "callable")
RESERVED_TOOL_NAMES = frozenset({"task", "spawn_task", "task_status", "task_retry", "task_stop"})
ASK_USER_PATH = "agenttasks.runtime.approvals.ask_user"
BUDGET_KEYS = ("max_turns", "max_tokens", "max_tool_calls", "max_wall_seconds")
HITL_KEYS = ("timeout_minutes", "on_timeout")
TOOL_KEYS = ("path", "name", "description", "parameters", "needs_approval", "approval_prompt")
RESERVED_MODEL_PARAMS = frozenset({"model", "messages", "tools", "tool_choice", "stream"})


class UnknownAgent(LookupError):
    """No agent is registered under that id."""


@dataclass(frozen=True)
class RetryPolicy:
    """When a run that failed for a passing reason is tried again (docs/delegation.md#retry-policy).

    Attempt k + 1 starts `backoff_seconds × 2^(k−1)` seconds after attempt k failed, at most
    `max_backoff_seconds`, less a random share of up to `jitter` (so retries do not bunch).
    """

    max_attempts: int = 1  # 1: no automatic retry
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 60.0
    jitter: float = 0.25

    def delay(self, failed_attempt: int, draw: float) -> float:
        """Seconds before the attempt after `failed_attempt`; `draw` is uniform in [0, 1)."""
        exponential = self.backoff_seconds * 2 ** max(failed_attempt - 1, 0)
        return min(exponential, self.max_backoff_seconds) * (1 - self.jitter * draw)


@dataclass(frozen=True)
class AgentDef:
    """A validated agent definition."""

    id: str
    name: str = ""
    does: str = ""
    runtime: str = "chat"
    model: str = "inherit"
    system_prompt: str = ""
    tools: tuple[ToolSpec, ...] = ()
    team: tuple[str, ...] = ()
    budget: dict = field(default_factory=dict)
    hitl: dict = field(default_factory=dict)
    handler: Any = None
    files: dict | None = None
    model_params: dict = field(default_factory=dict)
    expose: bool = True
    a2a: bool = True  # served over the Agent2Agent protocol (docs/a2a.md); False opts out
    mcp: bool = True  # a tool of the MCP server (docs/mcp.md); False opts out
    metadata: dict = field(default_factory=dict)
    stream: bool = True  # chat: ask for a streamed completion (message.delta to live readers)
    timeout_seconds: float | None = None
    endpoint: str = "default"  # chat: whose limits its requests draw from (MODEL_LIMITS)
    patience_seconds: float | None = None  # chat: the longest wait for the provider's limits
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # automatic retries
    # A message under `steer` reaches a running run of a chat agent at its next turn; a callable
    # agent takes steered messages only if it says so (its handler reads `ctx.steered()`).
    steerable: bool | None = None  # None: chat agents yes, callables no
    steer_fallback: str = "enqueue"  # what `steer` does where this agent cannot be steered

    @property
    def takes_steering(self) -> bool:
        """Say whether a running run of this agent reads messages steered to it."""
        return self.runtime == "chat" if self.steerable is None else self.steerable

    @property
    def timeout(self) -> float:
        """Return seconds one execution of a run may take (its own, else DEFAULT_TIMEOUT)."""
        return self.timeout_seconds or app_settings.DEFAULT_TIMEOUT

    def snapshot(self) -> dict:
        """Return the JSON configuration a task keeps as `inherit`."""
        return {
            "id": self.id,
            "name": self.name,
            "runtime": self.runtime,
            "model": self.model,
            "team": list(self.team),
            "tools": [t.name for t in self.tools],
            "budget": self.budget,
            "hitl": self.hitl,
        }


RETRY_KEYS = tuple(RetryPolicy.__dataclass_fields__)


def _check_retry(agent_id: str, retry) -> RetryPolicy:
    if not isinstance(retry, dict):
        raise _fail(agent_id, f"retry must be a dict, not {retry!r}")
    unknown = sorted(set(retry) - set(RETRY_KEYS))
    if unknown:
        raise _fail(agent_id, f"retry: unknown keys {unknown}")
    for key, value in retry.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key == "max_attempts":
            valid = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        elif key == "jitter":
            valid = number and 0 <= value <= 1
        else:
            valid = number and value > 0
        if not valid:
            raise _fail(agent_id, f"retry: {key} has an invalid value {value!r}")
    return RetryPolicy(**retry)


def _fail(agent_id, message) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"agent {agent_id!r}: {message}")


def _load_tool(agent_id: str, entry) -> ToolSpec:
    if isinstance(entry, str):
        entry = {"path": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise _fail(agent_id, f"tools: malformed entry {entry!r}")
    unknown = set(entry) - set(TOOL_KEYS)
    if unknown:
        raise _fail(agent_id, f"tools: unknown keys {sorted(unknown)} in {entry['path']!r}")
    try:
        func = import_string(entry["path"])
    except ImportError as exc:
        raise _fail(agent_id, f"tools: cannot import {entry['path']!r}: {exc}") from exc
    if not callable(func):
        raise _fail(agent_id, f"tools: {entry['path']!r} is not callable")
    meta = dict(getattr(func, "agenttasks_tool", None) or {})
    meta.update({k: v for k, v in entry.items() if k != "path"})
    doc = (func.__doc__ or "").strip().splitlines()
    spec = ToolSpec(
        name=str(meta.get("name") or getattr(func, "__name__", "")),
        description=meta.get("description", doc[0] if doc else "") or "",
        parameters=meta.get("parameters") or dict(DEFAULT_PARAMETERS),
        func=func,
        needs_approval=bool(meta.get("needs_approval", False)),
        approval_prompt=meta.get("approval_prompt"),
        path=entry["path"],
    )
    if not ID_RE.match(spec.name):
        raise _fail(agent_id, f"tools: invalid tool name {spec.name!r}")
    if spec.name in RESERVED_TOOL_NAMES:
        raise _fail(agent_id, f'tools: "{spec.name}" is a reserved tool name')
    if spec.name == "ask_user" and entry["path"] != ASK_USER_PATH:
        raise _fail(agent_id, "tools: 'ask_user' may only be the shipped question tool")
    return spec


def _check_budget(agent_id: str, budget) -> dict:
    if not isinstance(budget, dict):
        raise _fail(agent_id, "budget must be a dict")
    for key, value in budget.items():
        if key not in BUDGET_KEYS:
            raise _fail(agent_id, f"budget: unknown key {key!r}")
        if value is None and key != "max_turns":
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = {
            "max_turns": isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            "max_tokens": isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            "max_tool_calls": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            "max_wall_seconds": number and value > 0,
        }[key]
        if not ok:
            raise _fail(agent_id, f"budget: {key} has an invalid value {value!r}")
    return dict(budget)


def _check_hitl(agent_id: str, hitl) -> dict:
    if not isinstance(hitl, dict):
        raise _fail(agent_id, "hitl must be a dict")
    for key in hitl:
        if key not in HITL_KEYS:
            raise _fail(agent_id, f"hitl: unknown key {key!r}")
    timeout = hitl.get("timeout_minutes")
    # Every approval and question has a deadline: None ("never lapses") is not a timeout.
    if "timeout_minutes" in hitl and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
    ):
        raise _fail(agent_id, f"hitl: timeout_minutes has an invalid value {timeout!r}")
    if "on_timeout" in hitl and hitl["on_timeout"] not in ("deny", "cancel"):
        raise _fail(
            agent_id, f"hitl: on_timeout must be 'deny' or 'cancel', not {hitl['on_timeout']!r}"
        )
    return dict(hitl)


def _check_seconds(agent_id: str, name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _fail(agent_id, f"{name} has an invalid value {value!r}")
    return value


def _check_endpoint(agent_id: str, value) -> str:
    if value is None:
        return "default"
    if not isinstance(value, str) or not ID_RE.match(value):
        raise _fail(agent_id, f"endpoint: invalid name {value!r}")
    return value


def build(agent_id: str, **fields) -> AgentDef:
    """Validate a definition and return it, or raise ImproperlyConfigured naming the field."""
    if not isinstance(agent_id, str) or not ID_RE.match(agent_id):
        raise _fail(agent_id, "invalid id (letters, digits, '_' and '-', 1 to 64 characters)")
    known = set(AgentDef.__dataclass_fields__) - {"id"}
    unknown = set(fields) - known
    if unknown:
        raise _fail(agent_id, f"unknown fields {sorted(unknown)}")
    runtime = fields.get("runtime") or "chat"
    if runtime not in RUNTIMES:
        raise _fail(agent_id, f"runtime: unknown runtime {runtime!r}")
    handler = fields.get("handler")
    if runtime == "callable":
        if handler is None:
            raise _fail(agent_id, "handler: a callable agent needs a handler")
        if isinstance(handler, str):
            try:
                handler = import_string(handler)
            except ImportError as exc:
                raise _fail(
                    agent_id, f"handler: cannot import {fields['handler']!r}: {exc}"
                ) from exc
        if not callable(handler):
            raise _fail(agent_id, "handler: not callable")
    tools = tuple(_load_tool(agent_id, entry) for entry in fields.get("tools") or ())
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise _fail(agent_id, f'tools: duplicate tool name "{duplicates[0]}"')
    team: list[str] = []
    for member in fields.get("team") or ():
        if not isinstance(member, str) or not ID_RE.match(member):
            raise _fail(agent_id, f"team: invalid agent id {member!r}")
        if member not in team:
            team.append(member)
    model_params = dict(fields.get("model_params") or {})
    if RESERVED_MODEL_PARAMS & set(model_params):
        raise _fail(
            agent_id,
            f"model_params may not set {sorted(RESERVED_MODEL_PARAMS & set(model_params))}",
        )
    stream = fields.get("stream", True)
    if not isinstance(stream, bool):
        raise _fail(agent_id, f"stream must be True or False, not {stream!r}")
    return AgentDef(
        id=agent_id,
        name=fields.get("name") or agent_id,
        does=fields.get("does") or "",
        runtime=runtime,
        model=fields.get("model") or "inherit",
        system_prompt=fields.get("system_prompt") or "",
        tools=tools,
        team=tuple(team),
        budget=_check_budget(agent_id, fields.get("budget") or {}),
        hitl=_check_hitl(agent_id, fields.get("hitl") or {}),
        handler=handler,
        files=fields.get("files"),
        model_params=model_params,
        expose=fields.get("expose", True),
        a2a=bool(fields.get("a2a", True)),
        mcp=bool(fields.get("mcp", True)),
        metadata=dict(fields.get("metadata") or {}),
        stream=stream,
        timeout_seconds=_check_seconds(agent_id, "timeout_seconds", fields.get("timeout_seconds")),
        endpoint=_check_endpoint(agent_id, fields.get("endpoint")),
        patience_seconds=_check_seconds(
            agent_id, "patience_seconds", fields.get("patience_seconds")
        ),
        retry=_check_retry(agent_id, fields.get("retry") or {}),
        steerable=_check_steerable(agent_id, fields.get("steerable")),
        steer_fallback=_check_fallback(agent_id, fields.get("steer_fallback", "enqueue")),
    )


STEER_FALLBACKS = ("reject", "enqueue", "interrupt", "rollback")


def _check_steerable(agent_id: str, value) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise _fail(agent_id, f"steerable must be True, False or None, not {value!r}")
    return value


def _check_fallback(agent_id: str, value) -> str:
    if value not in STEER_FALLBACKS:
        raise _fail(agent_id, f"steer_fallback must be one of {', '.join(STEER_FALLBACKS)}")
    return value


class _Registry:
    def __init__(self):
        self._lock = threading.Lock()
        self._code: dict[str, AgentDef] = {}
        self._merged: dict[str, AgentDef] | None = None

    def register(self, agent, *, replace_existing: bool = False, **fields) -> AgentDef:
        definition = agent if isinstance(agent, AgentDef) else build(agent, **fields)
        with self._lock:
            if definition.id in self._code and not replace_existing:
                raise _fail(definition.id, "already registered (pass replace=True)")
            self._code[definition.id] = definition
            self._merged = None
        return definition

    def unregister(self, agent_id: str) -> None:
        with self._lock:
            self._code.pop(agent_id, None)
            self._merged = None

    def reset(self) -> None:
        with self._lock:
            self._merged = None

    def all(self) -> dict[str, AgentDef]:
        with self._lock:
            if self._merged is not None:
                return self._merged
        # Built outside the lock: importing a handler's module may register agents (a site's
        # agents module often does), which takes the lock.
        built = {
            agent_id: build(agent_id, **(spec or {}))
            for agent_id, spec in (app_settings.AGENTS or {}).items()
        }
        with self._lock:
            for agent_id in built:
                if agent_id in self._code:
                    raise _fail(agent_id, "defined both in AGENTTASKS['AGENTS'] and in code")
            self._merged = {**built, **self._code}
            return self._merged


_registry = _Registry()


def register(agent_id, *, replace: bool = False, **fields) -> AgentDef:
    """Register an agent from code (call it from your AppConfig.ready())."""
    return _registry.register(agent_id, replace_existing=replace, **fields)


def unregister(agent_id: str) -> None:
    """Remove an agent registered from code (for tests)."""
    _registry.unregister(agent_id)


def reset() -> None:
    """Forget the merged view so the next read re-reads the settings."""
    _registry.reset()


def get(agent_id: str) -> AgentDef:
    """Return the agent registered under `agent_id` or raise UnknownAgent."""
    try:
        return _registry.all()[agent_id]
    except KeyError:
        raise UnknownAgent(f"unknown agent {agent_id!r}") from None


def agents() -> list[AgentDef]:
    """Return every registered agent, sorted by id."""
    return sorted(_registry.all().values(), key=lambda a: a.id)


def _reset_on_change(*, setting, **kwargs) -> None:
    # Agents defined in settings are re-read when a test overrides AGENTTASKS.
    if setting == "AGENTTASKS":
        reset()


setting_changed.connect(_reset_on_change)
