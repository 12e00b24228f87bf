"""The operator admin: inspect tasks and conversations, and act on them through the lifecycle.

Every state change an operator makes (cancel, retry, stop a tree, answer an action, delete a
conversation) calls `agenttasks.lifecycle`; nothing can be added or edited by hand.
"""

from . import conversations, records, schedules, tasks  # noqa: F401  (importing registers the admins)
