"""The task lifecycle (the brief's Manager): create, spawn, status, retry, stop, continuations.

Every status change goes through `store`; the lifecycle decides which transition to ask for,
refuses what a state does not allow (one refusal check per rule, which the REST API, the admin,
A2A and the model tools all call), launches runs after commit, and announces every won write
once (`announce`: signals, waiters, callbacks, wake-up delivery). docs/lifecycle.md is the
contract; this package is the Python API, one module per concern:

- `creation`: create, spawn          - `reading`: status, wait_for, list_tasks, meta_for
- `retries`: retry and its refusal   - `stopping`: stop, cancel, stop_tree
- `answering`: comments, messages (under a multitask strategy), answers to actions, their
  refusals, lapsed actions
- `endings`: a run's ending (pause, continue, finalize), model_has_result
- `recovery`: the reaper's pass, deleting trees
- `conversations`: conversations without a task (a host's, with no agent behind it, too),
  progress from site code
- `effects`: the announcer and launching; `base`: the Python view of a task
- `priorities`: a task's priority, set after create
"""

from ..types import Continuation, RunOutcome, StopOutcome, TaskInfo, TaskMeta
from .answering import (
    answer_refusal,
    comment,
    comment_refusal,
    expire_actions,
    message_refusal,
    resolve_action,
    resolve_as_person,
    send_to_task,
    waiting_on,
)
from .base import agent_name, conversation_id_of, info, progress_line
from .conversations import (
    adopt_agent,
    cancel_waiting,
    copy_conversation,
    create_conversation,
    delete_run,
    host_conversation,
    post_message,
    record_progress,
    stop_run,
    update_conversation,
    wait_for_run,
)
from .creation import create, delegate, spawn
from .effects import announce, resume_if_settled
from .endings import end_at_deadline, model_has_result, on_run_finished, take_owed
from .priorities import set_priority
from .reading import list_tasks, meta_for, status, wait_for
from .recovery import delete_conversation, delete_owned_by, recover
from .retries import retry, retry_refusal, retry_task
from .stopping import cancel, stop, stop_tree

__all__ = [
    "Continuation",
    "RunOutcome",
    "StopOutcome",
    "TaskInfo",
    "TaskMeta",
    "agent_name",
    "announce",
    "resolve_as_person",
    "set_priority",
    "answer_refusal",
    "cancel",
    "comment",
    "send_to_task",
    "comment_refusal",
    "conversation_id_of",
    "create",
    "delegate",
    "end_at_deadline",
    "create_conversation",
    "delete_conversation",
    "delete_owned_by",
    "expire_actions",
    "host_conversation",
    "info",
    "list_tasks",
    "message_refusal",
    "meta_for",
    "model_has_result",
    "on_run_finished",
    "post_message",
    "cancel_waiting",
    "adopt_agent",
    "copy_conversation",
    "delete_run",
    "stop_run",
    "wait_for_run",
    "progress_line",
    "record_progress",
    "recover",
    "resolve_action",
    "resume_if_settled",
    "retry",
    "retry_refusal",
    "retry_task",
    "spawn",
    "status",
    "stop",
    "stop_tree",
    "take_owed",
    "update_conversation",
    "wait_for",
    "waiting_on",
]
