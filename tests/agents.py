"""Deterministic agents the scenarios use (docs/rest.md#scenarios-cited-by-the-tests), registered in every process.

`gate` blocks until the test creates the file named by metadata["gate"], so a test in another
process can hold a run at a known point and release it.
"""

import logging
import os
import time

from agenttasks import registry
from agenttasks.delivery.wakeups import PREFIX
from agenttasks.runtime.base import Reply
from agenttasks.runtime.task_tools import task_tools


def echo(ctx):
    return Reply(
        content=f"Echo: {ctx.latest_user_message}",
        usage={"inputTokens": 1, "outputTokens": 2, "totalTokens": 3},
    )


def gate(ctx):
    ctx.progress({"step": 1, "of": 2, "name": "fetch"})
    path = ctx.metadata.get("gate", "")
    while not (path and os.path.exists(path)):
        ctx.check_cancelled()
        time.sleep(0.02)
    return Reply(content="released")


def slow(ctx):
    """Sleep metadata["seconds"], reporting progress steps evenly: metadata["steps"] of them, or
    one a second with metadata["progress"]."""
    seconds = float(ctx.metadata.get("seconds", 1))
    steps = int(ctx.metadata.get("steps") or (int(seconds) if ctx.metadata.get("progress") else 0))
    started = time.monotonic()
    deadline = started + seconds
    reported = 0
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        if reported < steps and time.monotonic() - started >= reported * seconds / steps:
            reported += 1
            ctx.progress({"step": reported, "of": steps, "name": "sleep"})
        time.sleep(0.05)
    return Reply(content=f"Slept {format(seconds, 'g')}s")


def clarify(ctx):
    users = [c for c in ctx.metadata["comments"] if c["role"] == "user"]
    if not users:
        return Reply(content="Which format?", metadata={"waitingForInput": True})
    return Reply(
        content=f"Done in {users[-1]['content']}",
        metadata={"comments": [c["content"] for c in users]},
    )


def counter(ctx):
    """Append one line per execution to the file metadata["log"], then echo."""
    with open(ctx.metadata["log"], "a") as fh:
        fh.write(ctx.run_id + "\n")
    return echo(ctx)


def boom(ctx):
    raise RuntimeError("kaboom")


def flaky(ctx):
    if ctx.attempt == 1:
        raise RuntimeError("rate limited")
    return Reply(content=f"Recovered on attempt {ctx.attempt}")


def approver(ctx):
    env = ctx.task.input if ctx.task is not None else ctx.input
    if ctx.request_approval("deploy", {"env": env}):
        return Reply(content=f"deployed to {env}")
    return Reply(content="not deployed")


def asker(ctx):
    answers = ctx.ask([{"id": "q1", "question": "Which format?", "options": ["PDF", "HTML"]}])
    values = (answers.get("q1") or {}).get("values") or []
    return Reply(content=f"format: {values[0] if values else 'none'}")


def lead(ctx):
    message = ctx.latest_user_message
    if message.startswith(PREFIX):
        return Reply(content="noted: " + message[len(PREFIX) :].split("\n", 1)[0])
    # A line of the run's own log: with tracing on, it names the run's trace and span.
    logging.getLogger("agenttasks.tests").info("lead.spawning run=%s", ctx.run_id)
    card = task_tools(ctx.conversation, ctx.run)[0].call(
        {"agent_name": "echo", "input": f"sub: {message}", "label": ""}, "spawn-1"
    )
    return Reply(content=card.text if card.is_error else f"Started {card.details['task_id']}")


DOCS_FILES = {
    "enabled": True,
    "allowedTypes": ["application/pdf", "text/*"],
    "maxSize": 1024,
    "maxCount": 2,
    "retentionDays": 7,
}

TEST_AGENTS = {
    "echo": {"handler": echo},
    "gate": {"handler": gate},
    "slow": {"handler": slow},
    # slow, and tried again when its worker dies under it (docs/lifecycle.md#automatic-retries)
    "sturdy": {"handler": slow, "retry": {"max_attempts": 2, "backoff_seconds": 0.1}},
    "clarify": {"handler": clarify},
    "boom": {"handler": boom},
    "counter": {"handler": counter},
    "flaky": {"handler": flaky},
    "approver": {"handler": approver},
    "strict-approver": {"handler": approver, "hitl": {"on_timeout": "cancel"}},
    "asker": {"handler": asker},
    "docs": {"handler": echo, "files": DOCS_FILES},
    "nofiles": {"handler": echo, "files": {"enabled": False}},
    "internal": {"handler": echo, "expose": False},
    "lead": {"handler": lead},
}


def register_test_agents():
    for agent_id, spec in TEST_AGENTS.items():
        registry.register(agent_id, runtime="callable", replace=True, **spec)
