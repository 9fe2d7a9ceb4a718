"""`configure_tracing`: the process's tracing from its settings, once, by the CLI.

Off unless the OTEL_* variables name an exporter (`consumers.settings.TracingSettings`);
on, the SDK (`consumers.telemetry.otel`, the `tracing` extra) is imported here
and nowhere else.
"""

from __future__ import annotations

import structlog

from consumers.settings import TracingSettings
from consumers.telemetry.tracing import NO_TRACING, Tracing, install

log = structlog.get_logger(__name__)


def configure_tracing(settings: TracingSettings) -> Tracing:
    """Set the process's tracing from `settings` (read from the OTEL_* variables)."""
    if not settings.enabled:
        return install(NO_TRACING)
    from consumers.telemetry.otel import OtelTracing  # the `tracing` extra: only when on

    traces = install(OtelTracing.from_sdk(settings))
    log.info("tracing_on", exporter=settings.exporter, protocol=settings.protocol)
    return traces
