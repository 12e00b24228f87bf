"""The Model Context Protocol over the same durable tasks (docs/mcp.md).

With the `mcp` extra (`mcp-types`, the protocol's wire types), the app serves MCP at
`<mount>/mcp` (Streamable HTTP) and over stdio (`manage.py agenttasks_mcp`): the background-task
tools our own models get (`spawn_task`, `task_status`, `task_retry`, `task_stop`), `task_answer`,
and one tool per exposed agent. Every task is an agenttasks task, created, answered and stopped
through the lifecycle. Protocol 2025-11-25 (the `initialize` handshake, sessions) and 2026-07-28
(stateless, `InputRequiredResult`) are both served. The serving stays in Django; this package
imports without the extra, so a site that does not install it still loads.
"""

from ..toolkit.lazy import installed


def available() -> bool:
    """Say whether mcp-types (the `mcp` extra) is installed (without importing it: it loads with
    the first MCP request)."""
    return installed("mcp_types")
