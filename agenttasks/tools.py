"""What a model-facing tool is: its spec, its result, what it sees, and its argument check.

One vocabulary for every tool a model can call: an agent's own `@tool` functions, the shipped
`ask_user`, the four background-task tools and the `task` delegation tool are all `ToolSpec`s, a
call of any of them returns a `ToolResult`, and `check_arguments` is the one validator of a
call's arguments. This module imports nothing of agenttasks but the tracing hook (which imports
only the settings), so the registry can stand on it.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import tracing

DEFAULT_PARAMETERS = {"type": "object", "properties": {}}

# JSON Schema primitive types and the Python values that have them (bool is no number here).
PRIMITIVES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


@dataclass
class ToolResult:
    """The result of a tool call: text for the model, plus details and a display hint for a UI."""

    text: str
    is_error: bool = False
    details: dict | None = None
    display: str | None = None


class InvalidArguments(ValueError):
    """A call's arguments do not fit the tool's schema: the first problem found.

    The chat runtime words it as docs/delegation.md#executing-a-responses-calls does (`invalid arguments for <tool>:
    …`); a tool called directly words it as the background-task tools always have (`<tool>:
    invalid arguments: …`). Both wordings are model-facing and fixed.
    """

    def __init__(self, problem: str, prop: str = "", expected: str = ""):
        super().__init__(problem, prop, expected)
        self.problem = problem  # "json", "object", "missing", "type" or "unknown"
        self.prop = prop
        self.expected = expected

    def chat_text(self, name: str) -> str:
        """Word the problem for a call the chat runtime checks (never strictly: no `unknown`)."""
        detail = {
            "json": "arguments are not valid JSON",
            "object": "arguments must be a JSON object",
            "missing": f'missing required property "{self.prop}"',
            "type": f'property "{self.prop}" must be of type {self.expected}',
        }[self.problem]
        return f"invalid arguments for {name}: {detail}"

    def tool_text(self, name: str) -> str:
        """Word the problem for a tool called directly (`ToolSpec.call`: never JSON to decode)."""
        article = "an" if self.expected and self.expected[0] in "aeiou" else "a"
        detail = {
            "object": "arguments must be a JSON object",
            "unknown": f"unknown property {self.prop!r}",
            "missing": f"property {self.prop!r} is required",
            "type": f"property {self.prop!r} must be {article} {self.expected}",
        }[self.problem]
        return f"{name}: invalid arguments: {detail}"


def decode_arguments(raw) -> Any:
    """Decode a call's arguments as the model sent them (a JSON string; empty means `{}`)."""
    if not isinstance(raw, str):
        return raw
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        raise InvalidArguments("json") from None


def check_arguments(value, parameters: dict, *, strict: bool = False) -> dict:
    """Return the arguments when they fit the schema, else raise InvalidArguments.

    Required properties must be present and primitive-typed properties of their type. A strict
    schema (every property required, no others) is checked property by property, after refusing
    unknown ones; any other schema checks every required property before any type.
    """
    if not isinstance(value, dict):
        raise InvalidArguments("object")
    properties = parameters.get("properties") or {}

    def typed(prop: str) -> None:
        schema = properties[prop]
        expected = schema.get("type") if isinstance(schema, dict) else None
        if prop in value and expected in PRIMITIVES and not PRIMITIVES[expected](value[prop]):
            raise InvalidArguments("type", prop, expected)

    if strict:
        extra = sorted(set(value) - set(properties))
        if extra:
            raise InvalidArguments("unknown", extra[0])
        for prop in properties:
            if prop not in value:
                raise InvalidArguments("missing", prop)
            typed(prop)
        return value
    for prop in parameters.get("required") or ():
        if prop not in value:
            raise InvalidArguments("missing", prop)
    for prop in properties:
        typed(prop)
    return value


def as_result(value) -> ToolResult:
    """Turn what a tool function returned into its result (None is empty, others become JSON)."""
    if isinstance(value, ToolResult):
        return value
    if value is None:
        return ToolResult("")
    if isinstance(value, str):
        return ToolResult(value)
    return ToolResult(json.dumps(value, ensure_ascii=False, default=str))


class ToolContext:
    """What a tool function `fn(ctx, args)` sees of the call and of the run that makes it.

    `run` is the runtime's RunContext; when a site's own agent loop calls a tool there is none,
    and only `tool_call_id` is there.
    """

    def __init__(self, run, tool_call_id: str = ""):
        self._run = run
        self.tool_call_id = tool_call_id

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def conversation_id(self) -> str:
        return self._run.conversation_id

    @property
    def task_id(self) -> str | None:
        return self._run.task_id

    @property
    def agent_id(self) -> str:
        return self._run.agent_id

    @property
    def user(self):
        return self._run.user

    def check_cancelled(self) -> None:
        """Raise the runtime's stop exception on an immediate stop or when wall time is gone."""
        self._run.check_cancelled()

    def progress(self, state) -> None:
        """Record a progress state for the run."""
        self._run.progress(state)


@dataclass(frozen=True)
class ToolSpec:
    """A tool: what the model is told about it and the function `fn(ctx, args)` that runs it.

    `strict` tools (the background-task tools) promise the model a strict schema, and refuse
    unknown properties. `needs_approval` tools pause the run for a person before they run.
    """

    name: str
    description: str
    parameters: dict
    func: Callable[..., Any]
    needs_approval: bool = False
    approval_prompt: str | None = None
    path: str = ""
    strict: bool = False

    def schema(self) -> dict:
        """Return the OpenAI function entry the model is sent."""
        function = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }
        if self.strict:
            function["strict"] = True  # type: ignore[assignment]
        return {"type": "function", "function": function}

    def call(self, arguments, tool_call_id: str = "", *, ctx=None) -> ToolResult:
        """Check the arguments against the schema, then run the tool and return its result."""
        try:
            args = check_arguments(arguments, self.parameters, strict=self.strict)
        except InvalidArguments as exc:
            return ToolResult(exc.tool_text(self.name), is_error=True)
        return self.run(args, tool_call_id, ctx=ctx)

    def run(self, args: dict, tool_call_id: str = "", *, ctx=None) -> ToolResult:
        """Run the tool on arguments that need no check (checked, or approved by a person).

        `ctx` is the calling run's RunContext, None when a site's own loop calls the tool. It is
        traced as `execute_tool {name}` (docs/operating.md#traces).
        """
        with tracing.span(
            f"execute_tool {self.name}",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": self.name,
                "gen_ai.tool.type": "function",
                "gen_ai.tool.call.id": tool_call_id or None,
            },
        ) as traced:
            traced.content("gen_ai.tool.call.arguments", args)
            result = as_result(self.func(ToolContext(ctx, tool_call_id), args))
            traced.content("gen_ai.tool.call.result", result.text)
            # spawn_task's child, which the child's own `invoke_agent` span continues.
            traced.set("agenttasks.child.task_id", (result.details or {}).get("task_id"))
            if result.is_error:
                traced.fail("tool_error")
            return result


def tool(
    func=None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict | None = None,
    needs_approval: bool = False,
    approval_prompt: str | None = None,
):
    """Attach a JSON schema (and approval settings) to a tool function `fn(ctx, args)`."""

    def decorate(fn):
        doc = (fn.__doc__ or "").strip().splitlines()
        fn.agenttasks_tool = {
            "name": name or fn.__name__,
            "description": description if description is not None else (doc[0] if doc else ""),
            "parameters": parameters if parameters is not None else dict(DEFAULT_PARAMETERS),
            "needs_approval": needs_approval,
            "approval_prompt": approval_prompt,
        }
        return fn

    return decorate(func) if func is not None else decorate
