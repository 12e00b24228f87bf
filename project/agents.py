"""The demo site's agents (the README lists what each does)."""

import time

from agenttasks import registry
from agenttasks.conf import app_settings
from agenttasks.delivery.wakeups import PREFIX
from agenttasks.runtime.base import Reply
from agenttasks.runtime.task_tools import task_tools


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


def slow(ctx) -> Reply:
    """Sleep metadata.seconds (default 5) in 0.1 s steps, reporting progress once a second."""
    seconds = int(ctx.metadata.get("seconds", 5))
    steps = seconds * 10
    for i in range(steps):
        if i % 10 == 0:
            ctx.progress({"step": i // 10 + 1, "of": seconds, "name": "sleep"})
        ctx.check_cancelled()
        time.sleep(0.1)
    return Reply(content=f"Slept {seconds}s")


def clarify(ctx) -> Reply:
    """Ask `Which format?` the legacy way; answer `Done in <last user comment>` afterwards."""
    user_comments = [c for c in ctx.metadata["comments"] if c["role"] == "user"]
    if not user_comments:
        return Reply(content="Which format?", metadata={"waitingForInput": True})
    return Reply(content=f"Done in {user_comments[-1]['content']}")


def boom(ctx) -> Reply:
    """Fail with `kaboom`."""
    raise RuntimeError("kaboom")


def flaky(ctx) -> Reply:
    """Fail the first attempt with `rate limited`; recover on the next."""
    if ctx.attempt == 1:
        raise RuntimeError("rate limited")
    return Reply(content=f"Recovered on attempt {ctx.attempt}")


def approver(ctx) -> Reply:
    """Ask approval to `deploy` to the input's environment."""
    env = ctx.task.input if ctx.task is not None else ctx.input
    if ctx.request_approval("deploy", {"env": env}):
        return Reply(content=f"deployed to {env}")
    return Reply(content="not deployed")


def asker(ctx) -> Reply:
    """Ask which format (PDF or HTML) and reply with the answer."""
    answers = ctx.ask([{"id": "q1", "question": "Which format?", "options": ["PDF", "HTML"]}])
    values = (answers.get("q1") or {}).get("values") or [
        (answers.get("q1") or {}).get("freeText", "")
    ]
    return Reply(content=f"format: {values[0] if values else ''}")


def docs(ctx) -> Reply:
    """List the files of the conversation."""
    return Reply(content="Files: " + ", ".join(f"{f.name} ({f.size} bytes)" for f in ctx.files))


def lead(ctx) -> Reply:
    """Spawn a background echo task on a message; note the result when woken."""
    message = ctx.latest_user_message
    if message.startswith(PREFIX):
        first_line = message[len(PREFIX) :].split("\n", 1)[0]
        return Reply(content=f"noted: {first_line}")
    spawn_task = task_tools(ctx.conversation, ctx.run)[0]
    card = spawn_task.call(
        {"agent_name": "echo", "input": f"sub: {message}", "label": ""}, "lead-spawn"
    )
    if card.is_error:
        return Reply(content=card.text)
    return Reply(content=f"Started {card.details['task_id']}")


NO_FILES = {"enabled": False}  # the agent ignores files: the API and the playground say so

DEMO_AGENTS = {
    "echo": (echo, "replies Echo: <your message>", NO_FILES),
    "slow": (slow, "sleeps metadata.seconds (default 5), reporting progress", NO_FILES),
    "clarify": (clarify, "asks which format the legacy way, then finishes", NO_FILES),
    "boom": (boom, "always fails with kaboom", NO_FILES),
    "flaky": (flaky, "fails its first attempt, recovers on retry", NO_FILES),
    "approver": (approver, "asks approval to deploy to <input>", NO_FILES),
    "asker": (asker, "asks which format: PDF or HTML", NO_FILES),
    "docs": (
        docs,
        "lists the files it was given",
        {
            "enabled": True,
            "allowedTypes": ["application/pdf", "text/*"],
            "maxSize": 1024,
            "maxCount": 2,
        },
    ),
    "lead": (
        lead,
        "talk to it in a conversation: it spawns a background echo task, and notes the result "
        "when the task wakes the conversation (as a task of its own it cannot spawn one)",
        NO_FILES,
    ),
}


ASSISTANT_DOES = "chats through the configured model server; delegates to echo and slow"
ASSISTANT_PROMPT = (
    "You are the assistant of the agenttasks demo site. Answer briefly. Delegate a subtask to a "
    "teammate with the task tool, start long work in the background with spawn_task, and use "
    "ask_user only when you cannot continue without the person."
)


def assistant_unconfigured(ctx) -> Reply:
    """Explain which settings the assistant needs (no model server is configured)."""
    missing = [
        f"AGENTTASKS_{name} (or AGENTTASKS[{name!r}])"
        for name in ("MODEL_BASE_URL", "DEFAULT_MODEL")
        if not getattr(app_settings, name)
    ]
    return Reply(
        content="The assistant is not connected to a model server yet. Set "
        + " and ".join(missing)
        + " to any OpenAI-compatible server (a hosted API, vLLM, Ollama or llama.cpp), add "
        "AGENTTASKS_MODEL_API_KEY if it needs a key, and restart the site and the cluster."
    )


def register_assistant() -> None:
    """Register `assistant`: a chat agent when a model server is configured, else a notice."""
    if app_settings.MODEL_BASE_URL and app_settings.DEFAULT_MODEL:
        registry.register(
            "assistant",
            runtime="chat",
            does=ASSISTANT_DOES,
            system_prompt=ASSISTANT_PROMPT,
            tools=[registry.ASK_USER_PATH],
            team=["echo", "slow"],
            replace=True,
        )
    else:
        registry.register(
            "assistant",
            runtime="callable",
            handler=assistant_unconfigured,
            does=ASSISTANT_DOES + " (not configured: it says which settings it needs)",
            replace=True,
        )


def register_demo_agents() -> None:
    """Register the demo agents (idempotent, so tests can reload the app)."""
    for agent_id, (handler, does, files) in DEMO_AGENTS.items():
        registry.register(
            agent_id, runtime="callable", handler=handler, does=does, files=files, replace=True
        )
    register_assistant()
