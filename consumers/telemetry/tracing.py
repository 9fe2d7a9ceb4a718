"""OpenTelemetry tracing, configured by the standard OTEL_* variables only; off and free
without them.

Tracing is on when the environment names where spans go: `OTEL_TRACES_EXPORTER`
(`otlp` or `console`), or an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), and `OTEL_SDK_DISABLED` is not `true`
(`consumers.settings.TracingSettings.from_env`). The SDK then reads the rest
itself: `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (the resource, so
serve, relay and workers are told apart in one trace), `OTEL_TRACES_SAMPLER`
and `OTEL_TRACES_SAMPLER_ARG`, `OTEL_BSP_*` (the batch span processor),
`OTEL_EXPORTER_OTLP_*` (endpoint, headers, timeout; protocol http/protobuf).
Without them nothing of OpenTelemetry is imported, nothing is sent anywhere
(the default OTLP port included), and every hook in the framework is one test
of `Tracing.on`.

W3C Trace Context crosses every hop of a send:

    HTTP request (traceparent) -> serve's SERVER span (FastAPI's own) -> "create <queue>"
    PRODUCER span, its context kept in the outbox row's headers -> the relay's "publish
    <queue>" PRODUCER span, its context in the AMQP headers (`traceparent`,
    `tracestate`; our Publisher does the same) -> the worker's "process <queue>"
    CONSUMER span per message, a child of its publisher's (pika's and kombu's
    too) and linked to its batch's span, which holds the claim and the commit ->
    a "send <provider>" CLIENT span per provider call, with the provider's id.

A retry or a dead letter is republished with the headers it came with, so the
publisher's `traceparent` stays as it came; a replay's span links to it.
`configure_tracing` (`consumers.telemetry.tracing_setup`) is called once per
process by the CLI, like `configure_logging`; `shutdown` flushes the spans when
the process stops.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Any, Protocol

from structlog.typing import EventDict, WrappedLogger

TRACE_HEADERS = ("traceparent", "tracestate")
Attributes = Mapping[str, str | int | float | bool]


class SpanKind(StrEnum):
    SERVER = "server"
    CLIENT = "client"
    PRODUCER = "producer"
    CONSUMER = "consumer"
    INTERNAL = "internal"


class Span(Protocol):
    """What the framework does with a span (an OpenTelemetry span when tracing is on)."""

    def set_attribute(self, key: str, value: str | int | float | bool) -> None: ...

    def end(self, end_time: int | None = None) -> None: ...


class Tracing:
    """Tracing off: every method does nothing, and callers test `on` before building
    attributes. `consumers.telemetry.otel.OtelTracing` is the same seam, on."""

    on = False

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
        """A started span, a child of `parent` (a span, or a carrier's trace headers;
        None: the current span), linked to `links`; None when tracing is off."""
        return None

    def headers(self, span: Span | None) -> dict[str, str]:
        """`traceparent` (and `tracestate`) of `span`, for a message or a row."""
        return {}

    def ids(self, span: Span | None) -> dict[str, str]:
        """`trace_id` and `span_id` of `span` as log fields (hex); {} without one."""
        return {}

    @contextmanager
    def current(self, span: Span | None) -> Iterator[None]:
        """`span` is the current span inside (log lines written there carry its ids)."""
        yield

    def fail(self, span: Span | None, reason: str) -> None:
        """Mark `span` as an error with `reason`."""

    def shutdown(self) -> None:
        """Flush the spans not yet exported; nothing when off."""

    def tracer_provider(self) -> Any:
        """The SDK's TracerProvider, for a library that makes spans of its own (FastAPI's
        server spans); None when off."""
        return None


NO_TRACING = Tracing()
_process: Tracing = NO_TRACING


def tracing() -> Tracing:
    """The process's tracing, as `configure_tracing` set it (off until then)."""
    return _process


def install(traces: Tracing) -> Tracing:
    """Make `traces` the process's tracing (`consumers.telemetry.tracing_setup` does)."""
    global _process
    _process = traces
    return traces


def add_trace_ids(logger: WrappedLogger, name: str, event_dict: EventDict) -> EventDict:
    """A structlog processor: a line written inside a span carries `trace_id` and `span_id`."""
    if _process.on and "trace_id" not in event_dict:
        event_dict.update(_process.ids(None))
    return event_dict
