"""A start a service failed: one `start_failed` line and exit status 3, no traceback.

`run` (consumers.runtime.process), `relay` (consumers.publishing.relay) and
`serve` (ingress.serve) end the same way when PostgreSQL or RabbitMQ does not
answer while they start: the line carries the error's type and text (the
address refused, the password rejected), which is all a traceback through
asyncpg or aiormq would say, and the exit status tells a supervisor or an
orchestrator to restart the process.
"""

from __future__ import annotations

import aio_pika
import aiormq
import structlog

from consumers.message.verdict import error_text
from dedupe.lost import CONNECTION_ERRORS

log = structlog.get_logger(__name__)

# The exit status of a process whose start failed (a supervisor restarts it);
# 0 is a stop that was asked for, a traceback's 1 a bug.
EXIT_START_FAILED = 3
# What a start fails on that a restart may cure: a service down, a connection cut,
# a queue the broker will not let us consume now (another client's exclusive
# consumer holds it, or the user lacks read permission: a rejected password's kind).
START_FAILURES: tuple[type[BaseException], ...] = (
    *CONNECTION_ERRORS,
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelAccessRefused,
    aio_pika.exceptions.ChannelInvalidStateError,
)


def start_failed(error: BaseException) -> int:
    """Log the one `start_failed` line for `error` (one of START_FAILURES); EXIT_START_FAILED."""
    log.error("start_failed", error=error_text(error), exit_code=EXIT_START_FAILED)
    return EXIT_START_FAILED
