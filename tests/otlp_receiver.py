"""An OTLP/HTTP trace receiver on loopback: decodes each export request with opentelemetry-proto
and keeps its spans, as a collector would receive them."""

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict
    links: list  # (trace id, span id)
    events: list  # (name, attributes)
    status: int  # 0 unset, 1 ok, 2 error
    service: str
    resource: dict = field(default_factory=dict)


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attributes(pairs) -> dict:
    return {pair.key: _value(pair.value) for pair in pairs}


class Receiver:
    """Serve POST /v1/traces on 127.0.0.1; `spans` holds every span received."""

    def __init__(self):
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._keep(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            links=[
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ],
                            events=[(e.name, _attributes(e.attributes)) for e in span.events],
                            status=span.status.code,
                            service=str(resource.get("service.name", "")),
                            resource=resource,
                        )
                    )
        with self.lock:
            self.spans.extend(received)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
