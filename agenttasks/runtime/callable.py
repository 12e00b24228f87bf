"""The callable runtime: a Python function `handle(ctx) -> Reply` runs the whole turn."""

from ..states import OutcomeStatus, TaskKind
from ..types import RunOutcome
from . import result_files
from .base import (
    GracefulStop,
    PauseRun,
    Reply,
    RetryableError,
    RunContext,
    RunStopped,
    release_connection,
)


def execute(ctx: RunContext) -> RunOutcome:
    """Run the agent's handler once and report how the run ended."""
    release_connection()  # the handler takes one when it talks to the database
    try:
        reply = ctx.agent.handler(ctx)
    except PauseRun as pause:
        return RunOutcome(
            ctx.run_id, OutcomeStatus.INPUT_REQUIRED, text=pause.text, actions=pause.actions
        )
    except GracefulStop:
        return RunOutcome(ctx.run_id, OutcomeStatus.COMPLETED, graceful_stop=True)
    except RunStopped:
        return RunOutcome(ctx.run_id, OutcomeStatus.CANCELLED)
    except RetryableError as exc:
        error = str(exc) or type(exc).__name__
        return RunOutcome(ctx.run_id, OutcomeStatus.FAILED, error=error, retryable=True)
    if reply is None:
        reply = Reply()
    elif isinstance(reply, str):
        reply = Reply(content=reply)
    metadata = dict(reply.metadata or {})
    if (
        metadata.get("waitingForInput")
        and ctx.task is not None
        and ctx.task.kind != TaskKind.DELEGATE
    ):
        # The legacy clarification: the question is an agent comment; the next comment answers.
        return RunOutcome(
            ctx.run_id,
            OutcomeStatus.INPUT_REQUIRED,
            text=reply.content,
            clarification=reply.content,
            metadata=metadata,
            usage=reply.usage,
        )
    ctx.check_cancelled()
    stored = result_files.store(ctx, reply.files)
    return RunOutcome(
        ctx.run_id,
        OutcomeStatus.COMPLETED,
        text=reply.content,
        usage=reply.usage,
        metadata=metadata,
        graceful_stop=ctx.stop.after_turn,
        task_result={
            "content": reply.content,
            "metadata": metadata,
            "usage": reply.usage,
            "files": stored,
        },
    )
