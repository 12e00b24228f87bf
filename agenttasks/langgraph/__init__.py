"""LangGraph's Agent Server API over the same durable conversations and runs (docs/langgraph.md).

`langgraph-sdk` clients, and the chat UIs built on it, drive agenttasks at `<mount>/langgraph`:
assistants are the exposed agents, threads are conversations, runs are their runs, interrupts
are the pending approvals and questions. A surface like A2A and MCP: a mapping onto
`agenttasks.lifecycle`, with the REST API's authenticators, isolation, throttles and limits, and
LangGraph's wire (its status names, event names, shapes and `{"detail": ...}` errors). It needs
no extra: the SDK is only the tests' client.
"""
