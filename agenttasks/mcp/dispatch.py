"""The MCP methods, whichever transport carries them (Streamable HTTP, stdio).

`initialize` opens a 2025-11-25 session; `server/discover` describes the server to a 2026-07-28
client; `tools/list` and `tools/call` are the tools (tools.py, calls.py); `ping` and
`logging/setLevel` are answered where the version has them. Every request is first checked
against its version's wire types (protocol.check), so a method the version lacks is
METHOD_NOT_FOUND and malformed params are INVALID_PARAMS. From the client: a
`notifications/cancelled` stops the task of the call it names; a response is the answer to an
`elicitation/create`.
"""

import logging
from typing import Any

from .. import __version__, lifecycle, tracing
from ..exceptions import AlreadyFinal, TaskNotFound
from ..models import Task
from ..runtime.base import release_connection
from ..states import LIVE, TaskKind
from ..toolkit import caps
from . import calls, extension, protocol, sessions, tools
from .calls import Exchange
from .sessions import Caller, Session

logger = logging.getLogger(__name__)

SERVER_INFO = {"name": "agenttasks", "title": "agenttasks", "version": __version__}
# 2026-07-28 results a client may cache: the tool list changes only with a deployment.
CACHE = {"ttlMs": 0, "cacheScope": "private"}


def capabilities(modern: bool) -> dict:
    """Return what the server offers: tools, and (2025-11-25) the log messages of notices.py."""
    offered: dict[str, Any] = {"tools": {"listChanged": False}}
    if not modern:
        offered["logging"] = {}
    else:  # an agent's call may run as a task the client follows (extension.py)
        offered["extensions"] = {extension.EXTENSION: {}}
    return offered


def initialize(caller: Caller, message: protocol.Message) -> tuple[Session, dict]:
    """Open a 2025-11-25 session: the version both speak, and the server's capabilities."""
    version = protocol.negotiate(message.params.get("protocolVersion"))
    protocol.check(message, version)
    session = sessions.open_session(caller, version, message.params.get("capabilities"))
    result = {
        "protocolVersion": version,
        "capabilities": capabilities(False),
        "serverInfo": SERVER_INFO,
        "instructions": tools.instructions(),
    }
    return session, protocol.response(message.id, protocol.shape("initialize", version, result))


def discover() -> dict:
    return {
        "supportedVersions": list(protocol.MODERN),
        "capabilities": capabilities(True),
        "instructions": tools.instructions(),
        "resultType": "complete",
        "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO},
        **CACHE,
    }


def answer(exchange: Exchange) -> "dict | calls.CallFollower | extension.TaskListener":
    """Return the JSON-RPC response to a request, or the follower of an agent's call that answers
    it; traced as the MCP conventions name it (`tools/call {tool}`, `tasks/get`, …)."""
    message = exchange.message
    tool = message.params.get("name") if message.method == "tools/call" else None
    attributes = {
        "mcp.method.name": message.method,
        "mcp.protocol.version": exchange.session.version,
        "jsonrpc.request.id": str(message.id),
        "gen_ai.conversation.id": exchange.session.conversation_id,
        "gen_ai.tool.name": tool,
        "gen_ai.operation.name": "execute_tool" if tool else None,
    }
    name = f"{message.method} {tool}" if tool else message.method
    with tracing.span(name, attributes, kind="SERVER", expected=(protocol.McpError,)) as traced:
        try:
            return _answer(exchange)
        except protocol.McpError as exc:
            traced.fail(str(exc.code), exc.message)
            raise


def _answer(exchange: Exchange) -> "dict | calls.CallFollower | extension.TaskListener":
    session, message = exchange.session, exchange.message
    if message.method in extension.METHODS:
        result = extension.answer(session, message, exchange.name_header)
        return protocol.response(message.id, result)
    protocol.check(message, session.version)
    method = message.method
    if method == "subscriptions/listen":
        return extension.listen(exchange)
    if method == "tools/call":
        out = call_tool(exchange)
        if isinstance(out, calls.CallFollower):
            return out
        if isinstance(out, extension.TaskCreated):
            return protocol.response(message.id, dict(out))
        result = out
    elif method == "tools/list":
        result = {"tools": tools.catalogue(), **(CACHE if session.modern else {})}
    elif method == "server/discover":
        result = discover()
    elif method in ("ping", "logging/setLevel"):
        # The log level is not kept: the wake-up notices are sent at `notice` (docs/mcp.md).
        result = {}
    elif method == "initialize":
        raise protocol.invalid_request("This session is initialized already")
    else:  # a method the version has that this server does not serve (resources, prompts, …)
        raise protocol.method_not_found(method)
    return protocol.response(message.id, protocol.shape(method, session.version, result))


def call_tool(exchange: Exchange) -> "dict | calls.CallFollower":
    name = str(exchange.message.params.get("name"))  # a string: the wire types checked it
    arguments = exchange.message.params.get("arguments")
    task_tool = name in tools.TASK_TOOLS or name == tools.ANSWER
    agent = None if task_tool else tools.served_agent(name)
    if not task_tool and agent is None:
        raise protocol.invalid_params(f"Unknown tool: {name}")
    args = tools.check(name, arguments)
    if (
        agent is not None
        and exchange.session.tasks
        and "inputResponses" not in exchange.message.params
    ):
        # The client follows the task itself: the task is made, and named, at once.
        out = calls.start(exchange, agent.id, args)
        if isinstance(out, calls.CallFollower):
            return extension.created(Task.objects.select_related("run").get(pk=out.task_id))
        return out
    if agent is not None:
        # The place is taken before the task is made: refused it (429), nothing was written.
        exchange.hold(caps.STREAM if exchange.streaming else caps.WAIT)
        try:
            out = calls.start(exchange, agent.id, args)
        except BaseException:
            exchange.release()
            raise
        if not isinstance(out, calls.CallFollower):
            exchange.release()
        return out
    if not tools.waits(name, args):
        return tools.TaskTools(exchange.session, exchange.message.id).call(name, args)
    exchange.hold(caps.WAIT)
    try:

        def stop_check() -> bool:
            release_connection()  # a waiting call holds no connection
            return caps.gone(exchange.client_fd)

        return tools.TaskTools(exchange.session, exchange.message.id, stop_check).call(name, args)
    finally:
        exchange.release()


def notified(session: Session, message: protocol.Message) -> None:
    """Handle a client's notification: a cancel stops the task of the call it names."""
    if message.method == "notifications/cancelled":
        cancel(session, message.params.get("requestId"))


def cancel(session: Session, request_id: Any) -> None:
    """Stop the live task an agent's call with that request id started in the session."""
    if request_id is None or isinstance(request_id, (dict, list)):
        return
    task = (
        Task.objects.filter(
            parent_conversation_id=session.conversation_id,
            tool_call_id=calls.call_id(request_id),
            status__in=LIVE,
        )
        .exclude(kind=TaskKind.DELEGATE)
        .order_by("-created_at")
        .first()
    )
    if task is None:
        return
    try:
        lifecycle.stop(task.id)
        logger.info("mcp.call_cancelled task=%s request=%s", task.id, request_id)
    except (AlreadyFinal, TaskNotFound):
        pass


def responded(session: Session, message: protocol.Message) -> None:
    """Handle a client's response: its answer to one of the server's elicitation/create."""
    calls.answered(session, message)
