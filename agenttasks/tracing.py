"""OpenTelemetry traces across the queue (docs/operating.md#traces), with the `otel` extra.

Off (`TRACING` False, the default), nothing here imports OpenTelemetry and every hook is one
check of a module global. On, `setup()` installs a tracer provider exporting by OTLP (configured
by the standard `OTEL_*` environment variables) and Django's instrumentation; `TraceIds` puts
the trace and span ids in log lines.

The trace crosses the queue in the rows: a task and each run record `traceparent`, the W3C
context current when they were written (the request's span, or the tool call's that spawned a
child). A run's span (`invoke_agent {agent}`) is a child of its task's context, on whichever node
claims it; a run after the first (a retry, a comment, a continuation, a wake-up) also links to
the run before it, to what recorded it, and a wake-up to the children's runs it reports.

A run's span id is derived from its run id, so any process can link to a run's span without
anyone storing it.
"""

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from .conf import app_settings

TRACER_NAME = "agenttasks"
# The span set in motion by setup(); None while tracing is off.
_tracer: Any = None
# The span id the next span of this thread takes (a run's, derived from its id).
_next_span_id: Any = None


def enabled() -> bool:
    """Say whether traces are recorded (TRACING on and set up)."""
    return _tracer is not None


# What the `otel` extra installs (a system check names what is missing: agenttasks.E008).
REQUIRED = (
    "opentelemetry.sdk",
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.instrumentation.django",
)


def missing() -> list[str]:
    """Return the modules of the `otel` extra that cannot be imported."""
    import importlib.util

    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ImportError:
            return False

    return [name for name in REQUIRED if not found(name)]


def setup() -> None:
    """Install the tracer provider, its OTLP exporter and Django's instrumentation, once per
    process, when TRACING is on (and the `otel` extra installed: else the check says so)."""
    global _tracer, _next_span_id
    if not app_settings.TRACING or _tracer is not None or missing():
        return
    import contextvars

    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    _next_span_id = contextvars.ContextVar("agenttasks_next_span_id", default=0)

    class RunSpanIds(RandomIdGenerator):
        """Random ids, except the span id a run's span is given (`_derived`)."""

        def generate_span_id(self) -> int:
            wanted = _next_span_id.get()
            if wanted:
                _next_span_id.set(0)
                return wanted
            return super().generate_span_id()

    service = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "agenttasks"}
    provider = TracerProvider(resource=Resource.create(service), id_generator=RunSpanIds())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    _tracer = trace.get_tracer(TRACER_NAME)


# --- the context in the rows -----------------------------------------------------------------


def current_traceparent() -> str:
    """Return the W3C `traceparent` of the current span ("" without one, or tracing off): the
    default of a task's and a run's `traceparent`."""
    if _tracer is None:
        return ""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse(traceparent: str) -> Any:
    """Return the SpanContext a `traceparent` names (None when empty or malformed)."""
    parts = (traceparent or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    from opentelemetry.trace import SpanContext, TraceFlags

    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


def _derived(run_id: str) -> int:
    """Return the span id of a run's span: the first 8 bytes of its id's SHA-256."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:8], "big") or 1


def run_context(run_id: str, traceparent: str) -> Any:
    """Return the SpanContext of a run's span, whose parent `traceparent` names."""
    parent = parse(traceparent)
    if parent is None:
        return None
    from opentelemetry.trace import SpanContext

    return SpanContext(
        parent.trace_id, _derived(run_id), is_remote=True, trace_flags=parent.trace_flags
    )


def headers() -> dict[str, str]:
    """Return the `traceparent` header of the current span (none while tracing is off)."""
    traceparent = current_traceparent()
    return {"traceparent": traceparent} if traceparent else {}


# --- spans -----------------------------------------------------------------------------------


class Span:
    """A recording span, or nothing while tracing is off: its writers do nothing then."""

    def __init__(self, span: Any = None):
        self.span = span

    def set(self, key: str, value: Any) -> None:
        if self.span is not None and value is not None:
            self.span.set_attribute(key, value)

    def rename(self, name: str) -> None:
        if self.span is not None:
            self.span.update_name(name)

    def event(self, name: str, **attributes: Any) -> None:
        if self.span is not None:
            self.span.add_event(name, {k: v for k, v in attributes.items() if v is not None})

    def fail(self, error_type: str, description: str = "") -> None:
        if self.span is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_attribute("error.type", error_type)
            self.span.set_status(Status(StatusCode.ERROR, description or None))

    def content(self, key: str, value: Any) -> None:
        """Record message content, only when TRACE_CONTENT opts in (the conventions' rule)."""
        if self.span is not None and app_settings.TRACE_CONTENT:
            self.span.set_attribute(key, value if isinstance(value, str) else json.dumps(value))


NOTHING = Span()


class TraceIds(logging.Filter):
    """Give each log record `trace`: " trace_id=<32 hex> span_id=<16 hex>" while a span is
    current (a run's, a request's), else "" (a handler's format names it as `%(trace)s`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace = ""
        if _tracer is not None:
            from opentelemetry import trace

            context = trace.get_current_span().get_span_context()
            if context.is_valid:
                record.trace = f" trace_id={context.trace_id:032x} span_id={context.span_id:016x}"
        return True


def current() -> Span:
    """Return the current span (nothing while tracing is off)."""
    if _tracer is None:
        return NOTHING
    from opentelemetry import trace

    return Span(trace.get_current_span())


@contextlib.contextmanager
def span(
    name: str, attributes: dict[str, Any] | None = None, *, kind: str = "INTERNAL", expected=()
) -> Iterator[Span]:
    """Open a child span of the current one (nothing while tracing is off). An exception ends
    it as an error (`error.type`, its class), unless it is one of `expected` (a run stopped, a
    run parked for its provider's limit)."""
    if _tracer is None:
        yield NOTHING
        return
    from opentelemetry.trace import SpanKind

    clean = {k: v for k, v in (attributes or {}).items() if v is not None}
    with _tracer.start_as_current_span(
        name, kind=SpanKind[kind], attributes=clean, set_status_on_exception=False
    ) as opened:
        traced = Span(opened)
        try:
            yield traced
        except expected:
            raise
        except BaseException as exc:
            traced.fail(type(exc).__name__, str(exc))
            raise


@contextlib.contextmanager
def continued(traceparent: str, name: str, attributes: dict[str, Any]) -> Iterator[Span]:
    """Open a span in the trace `traceparent` names, outside any request (a delivery's)."""
    if _tracer is None:
        yield NOTHING
        return
    from opentelemetry import context, trace

    parent = parse(traceparent)
    token = (
        context.attach(trace.set_span_in_context(trace.NonRecordingSpan(parent)))
        if parent
        else None
    )
    try:
        with span(name, attributes, kind="CLIENT") as opened:
            yield opened
    finally:
        if token is not None:
            context.detach(token)


@contextlib.contextmanager
def run_span(run: Any, causes: Callable[[Any, Any], list[Any]]) -> Iterator[Span]:
    """Trace a run as `invoke_agent {agent}`: a child of its task's context (or, without a
    task, of the run's own), linked to the span contexts `causes(run, parent)` returns; its id
    derived from the run's."""
    if _tracer is None:
        yield NOTHING
        return
    from opentelemetry import context, trace
    from opentelemetry.trace import Link, SpanKind

    task = run.task
    parent = parse(task.traceparent if task is not None else run.traceparent)
    links = [Link(c) for c in causes(run, parent)]
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": run.agent,
        "gen_ai.agent.id": run.agent,
        "gen_ai.conversation.id": run.conversation_id,
        "agenttasks.run.id": run.id,
        "agenttasks.run.trigger": run.trigger,
        "agenttasks.run.attempt": run.attempt,
    }
    if task is not None:
        attributes["agenttasks.task.id"] = task.id
    # A run's context is its task's, not the one of whatever thread claims it.
    token = context.attach(
        trace.set_span_in_context(trace.NonRecordingSpan(parent))
        if parent is not None
        else context.Context()
    )
    _next_span_id.set(_derived(run.id))
    try:
        with _tracer.start_as_current_span(
            f"invoke_agent {run.agent}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
        ) as opened:
            yield Span(opened)
    finally:
        _next_span_id.set(0)
        context.detach(token)


def ended(traced: Span, outcome: Any) -> None:
    """Record a run's outcome on its span: a failure or a stop as `error.type`."""
    traced.set("agenttasks.run.outcome", str(outcome.status))
    if str(outcome.status) in ("failed", "cancelled"):
        traced.fail(str(outcome.status), outcome.error or "")
