"""What agents are written against: the `tool` decorator, ToolResult and Reply."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class ToolResult:
    """The result of a tool call as the model will see it."""

    output: str
    is_error: bool = False
    metadata: dict | None = None


@dataclass
class Reply:
    """What a callable handler returns."""

    content: str = ""
    usage: dict | None = None
    metadata: dict = field(default_factory=dict)
    files: list = field(default_factory=list)


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: the function and what the model is told about it."""

    name: str
    description: str
    parameters: dict
    func: Callable[..., Any]
    needs_approval: bool = False
    approval_prompt: str | None = None
    path: str = ""


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
