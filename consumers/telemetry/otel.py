"""Tracing on: the OpenTelemetry SDK behind `consumers.telemetry.tracing.Tracing`.

Imported only when tracing is configured (the `tracing` extra). One
TracerProvider per process with the SDK's own reading of the OTEL_* variables:
`Resource.create()` (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), the sampler
(OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG), `BatchSpanProcessor`
(OTEL_BSP_*), the OTLP/HTTP exporter (OTEL_EXPORTER_OTLP_*). Trace context
travels as W3C `traceparent`/`tracestate`, read from AMQP headers, HTTP headers
and outbox rows by a getter that takes text values only: a header of another
type (a publisher's bytes, a number) is no context, never an error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Self

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import Link, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from consumers.message.decisions import ConfigurationError
from consumers.settings import TracingSettings
from consumers.telemetry.tracing import Attributes, Span, SpanKind, Tracing

_KINDS = {
    SpanKind.SERVER: trace.SpanKind.SERVER,
    SpanKind.CLIENT: trace.SpanKind.CLIENT,
    SpanKind.PRODUCER: trace.SpanKind.PRODUCER,
    SpanKind.CONSUMER: trace.SpanKind.CONSUMER,
    SpanKind.INTERNAL: trace.SpanKind.INTERNAL,
}
_PROPAGATOR = TraceContextTextMapPropagator()


class _TextGetter(Getter[Mapping[str, Any]]):
    """Header values that are text; anything else carries no context."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return [key for key in carrier if isinstance(key, str)]


_GETTER = _TextGetter()


def _exporter(settings: TracingSettings) -> SpanExporter:
    if settings.exporter == "console":
        return ConsoleSpanExporter()
    if settings.protocol not in ("http/protobuf", ""):
        raise ConfigurationError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={settings.protocol}: only http/protobuf is supported"
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


class OtelTracing(Tracing):
    """Tracing on: spans from the process's TracerProvider (see the module docstring)."""

    on = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("idempotent-workers")

    @classmethod
    def from_sdk(cls, settings: TracingSettings) -> Self:
        provider = TracerProvider(resource=Resource.create())
        provider.add_span_processor(BatchSpanProcessor(_exporter(settings)))
        trace.set_tracer_provider(provider)
        return cls(provider)

    def span(
        self,
        name: str,
        kind: SpanKind,
        *,
        parent: Span | Mapping[str, Any] | None = None,
        attributes: Attributes | None = None,
        links: Sequence[Span | Mapping[str, Any]] = (),
        start_time: int | None = None,
    ) -> Span | None:
        return self.tracer.start_span(
            name,
            context=_context_of(parent),
            kind=_KINDS[kind],
            attributes=attributes,
            links=[link for link in map(_link_of, links) if link is not None],
            start_time=start_time,
        )

    def headers(self, span: Span | None) -> dict[str, str]:
        carrier: dict[str, str] = {}
        if isinstance(span, trace.Span):
            _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def ids(self, span: Span | None) -> dict[str, str]:
        found = span if isinstance(span, trace.Span) else trace.get_current_span()
        context = found.get_span_context()
        if not context.is_valid:
            return {}
        return {
            "trace_id": trace.format_trace_id(context.trace_id),
            "span_id": trace.format_span_id(context.span_id),
        }

    @contextmanager
    def current(self, span: Span | None) -> Iterator[None]:
        if not isinstance(span, trace.Span):
            yield
            return
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            otel_context.detach(token)

    def fail(self, span: Span | None, reason: str) -> None:
        if isinstance(span, trace.Span):
            span.set_status(Status(StatusCode.ERROR, reason))

    def shutdown(self) -> None:
        self.provider.shutdown()  # flushes the batch span processor

    def tracer_provider(self) -> TracerProvider:
        return self.provider


def _context_of(parent: Span | Mapping[str, Any] | None) -> otel_context.Context | None:
    if parent is None:
        return None  # the current context
    if isinstance(parent, trace.Span):
        return trace.set_span_in_context(parent)
    if not isinstance(parent, Mapping):
        return None
    carrier: Mapping[str, Any] = parent
    return _PROPAGATOR.extract(carrier, context=otel_context.Context(), getter=_GETTER)


def _link_of(source: Span | Mapping[str, Any]) -> Link | None:
    if isinstance(source, trace.Span):
        return Link(source.get_span_context())
    found = trace.get_current_span(_context_of(source)).get_span_context()
    return Link(found) if found.is_valid else None
