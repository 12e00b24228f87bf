"""The Agent2Agent (A2A) protocol 1.0 over the same durable tasks (docs/a2a.md).

Every registered agent that does not opt out (`a2a: False`) is an A2A server at
`<mount>/a2a/<agentId>/`, with its Agent Card at `<mount>/a2a/<agentId>/.well-known/agent-card.json`,
on the JSON-RPC and HTTP+JSON bindings. An A2A task *is* an agenttasks task: every operation goes
through the lifecycle and the REST read paths.

Messages are parsed and built with the official SDK (`a2a-sdk`, the `a2a` extra); this package
itself and its models import without it, so a site that does not install the extra still loads.
"""

from ..toolkit.lazy import installed


def available() -> bool:
    """Say whether the a2a-sdk (the `a2a` extra) is installed (without importing it: it loads
    with the first A2A request)."""
    return installed("a2a")
