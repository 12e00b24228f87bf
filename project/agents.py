"""The demo site's agents (the README lists what each does)."""

from agenttasks.runtime import registry
from agenttasks.runtime.base import Reply


def describe_state(state) -> str:
    """Render a progress state {"step", "of", "name"} as `step i/n (name)`."""
    if isinstance(state, dict) and "step" in state:
        line = f"step {state['step']}/{state.get('of', '?')}"
        return f"{line} ({state['name']})" if state.get("name") else line
    return ""


def echo(ctx) -> Reply:
    """Reply `Echo: <latest user message>`."""
    return Reply(
        content=f"Echo: {ctx.latest_user_message}",
        usage={"inputTokens": 1, "outputTokens": 2, "totalTokens": 3},
    )


def register_demo_agents() -> None:
    """Register the demo agents (idempotent, so tests can reload the app)."""
    registry.register(
        "echo",
        runtime="callable",
        handler=echo,
        does="replies Echo: <your message>",
        replace=True,
    )
