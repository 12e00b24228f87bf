"""The only writer of task and run statuses: every transition is one compare-and-set.

Each transition locks its rows (`select_for_update`, or the locks an UPDATE takes) in the order
`store.locking` documents, re-checks its predicate (the allowed statuses and the run id the caller
observed) on the locked rows, writes, appends its events in the same transaction, and answers
with the row as written, or None when the race was lost. An unknown id raises. On PostgreSQL the
hot transitions (create, claim, end) are one statement each (`store.postgres`).

- `store.locking`: the locks and the event log;
- `store.tasks`: task transitions; `store.claims`: claiming queued runs;
- `store.endings`: a run's ending and the finalize;
- `store.delays`: runs that start later (an automatic retry, a parked run);
- `store.runs`: conversations and their runs without a task;
- `store.busy_tasks`: a newer message to a busy task (enqueue, interrupt, rollback, steer);
- `store.sweeps`: the reaper's passes; `store.leases`: the heartbeat's;
- `store.deletion`: deleting a conversation tree;
- `store.debts`: wake-up debt, every change of a wake-up's state;
- `store.limits`: the user's active-task limit and the parent's cap.
"""

from .busy_tasks import hand_over, messages_wait, release_task_waiting, send_to_busy_task
from .claims import claim, claim_many, set_priority
from .debts import consume_wakeup, drop_wakeups, mark_delivered
from .delays import park, retry_later
from .deletion import (
    conversation_tree,
    delete_tree,
    interrupted_deletes,
    mark_deleting,
    stop_runs,
    stored_files,
)
from .endings import ORPHAN_TEXT, end, finalize, record_run_end, release_retry_claim
from .events import append_events, last_of_run, read_log
from .leases import Leases
from .limits import active_count, check_active_limit, live_count, lock_principal
from .locking import Log, lock_conversation, lock_task, retried
from .runs import (
    adopt_agent,
    answer_conversation_run,
    cancel_waiting,
    conversation_busy,
    copy_conversation,
    create_conversation,
    delete_run,
    escalations_open,
    host_conversation,
    pending_actions_below,
    release_waiting,
    resume_paused,
    start_conversation_run,
    stop_run,
    update_conversation,
    wake_conversation,
)
from .steering import steers_taken, take_steers
from .sweeps import (
    conversations_owed,
    expire_and_cancel,
    expired_actions,
    fail_dead_conversation_runs,
    fail_orphans,
    lapsed_actions,
    lease_cutoff,
    orphans,
    owed_wakeups,
    requeue_stale,
    stale_queued,
    stuck_endings,
)
from .tasks import (
    advance,
    answer,
    create_task,
    discard_spawn,
    pause,
    record_progress,
    reopen,
    request_stop,
    retry_claim,
    retry_prompt,
)

__all__ = [
    "ORPHAN_TEXT",
    "Leases",
    "Log",
    "active_count",
    "advance",
    "answer",
    "answer_conversation_run",
    "append_events",
    "last_of_run",
    "read_log",
    "check_active_limit",
    "claim",
    "claim_many",
    "set_priority",
    "cancel_waiting",
    "conversation_busy",
    "consume_wakeup",
    "conversation_tree",
    "conversations_owed",
    "create_conversation",
    "create_task",
    "delete_tree",
    "discard_spawn",
    "drop_wakeups",
    "end",
    "escalations_open",
    "expire_and_cancel",
    "expired_actions",
    "fail_dead_conversation_runs",
    "fail_orphans",
    "interrupted_deletes",
    "lapsed_actions",
    "lease_cutoff",
    "orphans",
    "owed_wakeups",
    "finalize",
    "host_conversation",
    "live_count",
    "lock_conversation",
    "lock_principal",
    "lock_task",
    "mark_delivered",
    "park",
    "mark_deleting",
    "pause",
    "pending_actions_below",
    "record_progress",
    "record_run_end",
    "release_retry_claim",
    "reopen",
    "request_stop",
    "requeue_stale",
    "stale_queued",
    "resume_paused",
    "retry_claim",
    "retry_later",
    "retried",
    "retry_prompt",
    "release_waiting",
    "adopt_agent",
    "stop_run",
    "copy_conversation",
    "delete_run",
    "release_task_waiting",
    "send_to_busy_task",
    "hand_over",
    "messages_wait",
    "start_conversation_run",
    "steers_taken",
    "take_steers",
    "stop_runs",
    "stored_files",
    "stuck_endings",
    "update_conversation",
    "wake_conversation",
]
