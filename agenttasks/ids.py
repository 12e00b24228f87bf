"""Prefixed random ids: a prefix and 21 characters of the URL-safe alphabet."""

import secrets

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
ID_LENGTH = 21
MAX_ID_LENGTH = 32


def new_id(prefix: str) -> str:
    """Return a fresh id with the given prefix."""
    # 64 symbols = 6 bits: masking each random byte keeps the draw uniform.
    return prefix + "".join(ALPHABET[b & 63] for b in secrets.token_bytes(ID_LENGTH))


def new_task_id() -> str:
    """Return a fresh task id."""
    return new_id("task_")


def new_conversation_id() -> str:
    """Return a fresh conversation id."""
    return new_id("conv_")


def new_run_id() -> str:
    """Return a fresh run id."""
    return new_id("run_")


def new_event_id() -> str:
    """Return a fresh event id."""
    return new_id("evt_")


def new_action_id() -> str:
    """Return a fresh pending-action id."""
    return new_id("act_")


def new_comment_id() -> str:
    """Return a fresh comment id."""
    return new_id("comment_")


def new_result_id() -> str:
    """Return a fresh task-result id."""
    return new_id("taskres_")


def new_file_id() -> str:
    """Return a fresh file id."""
    return new_id("file_")


def new_wakeup_id() -> str:
    """Return a fresh wake-up id."""
    return new_id("wake_")


def new_schedule_id() -> str:
    """Return a fresh schedule id."""
    return new_id("sched_")
