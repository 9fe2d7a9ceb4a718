"""A local OTLP/HTTP trace receiver: what the real exporter sends, decoded with opentelemetry-proto.

`POST /v1/traces` with an `ExportTraceServiceRequest` (protobuf, gzip or not);
every span is kept as an `ExportedSpan` with its resource's service name. The
server is the standard library's (`http.server`), on a thread of its own, so a
worker in this process and one in a child process export to it alike. The
tests read what arrives; the tracing bench (`proving.bench.tracing`) starts one
with `decode=False`, a sink that only counts, so it costs the machine little.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace_id, span_id)
    error: bool
    start_ns: int = 0
    end_ns: int = 0


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


@dataclass(slots=True)
class OtlpReceiver:
    server: ThreadingHTTPServer
    decode: bool = True
    spans: list[ExportedSpan] = field(default_factory=list)
    requests: int = 0
    received_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        port = self.server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def traced(self, trace_id: str) -> list[ExportedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def named(self, name: str) -> list[ExportedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def keep(self, body: bytes) -> None:
        if not self.decode:
            with self.lock:
                self.requests += 1
                self.received_bytes += len(body)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource_spans in request.resource_spans:
            service = next(
                (
                    _value(a.value)
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ExportedSpan(
                            service=service,
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=tuple((k.trace_id.hex(), k.span_id.hex()) for k in span.links),
                            error=span.status.code == 2,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )
        with self.lock:
            self.spans.extend(found)
            self.requests += 1


def start_receiver(host: str = "127.0.0.1", port: int = 0, *, decode: bool = True) -> OtlpReceiver:
    """A receiver listening on `host:port` (0: a free port), serving on a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            if self.headers.get("Content-Encoding") == "gzip" and receiver.decode:
                body = gzip.decompress(body)
            receiver.keep(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (its signature)
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    receiver = OtlpReceiver(server=server, decode=decode)
    threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True).start()
    return receiver
