"""A start that failed: one `start_failed` line and an exit status, no traceback.

A service that failed the start: exit status 3 (EXIT_START_FAILED).

`run` (consumers.runtime.process), `relay` (consumers.publishing.relay) and
`serve` (ingress.serve) end the same way when PostgreSQL or RabbitMQ does not
answer while they start: the line carries the error's type and text (the
address refused, the password rejected), which is all a traceback through
asyncpg or aiormq would say, and the exit status tells a supervisor or an
orchestrator to restart the process.

A configuration no restart cures: exit status 78 (EXIT_CONFIG, EX_CONFIG of
sysexits.h). `app_not_loaded()` says so for a MODULE:APP that gives no App
(`consumers.handlers.loading`), naming the module, the attribute, the folder
searched and the underlying error; `run` (one process or the supervisor,
before any child), `cleanup --app` end that way.
"""

from __future__ import annotations

import aio_pika
import aiormq
import structlog

from consumers.handlers.loading import AppNotLoaded
from consumers.message.verdict import error_text
from dedupe.lost import CONNECTION_ERRORS

log = structlog.get_logger(__name__)

# The exit status of a process whose start failed (a supervisor restarts it);
# 0 is a stop that was asked for, a traceback's 1 a bug.
EXIT_START_FAILED = 3
# A start refused by the configuration (a queue that exists with other
# arguments, a push lease under which no send could start, an app that is not
# there): EX_CONFIG of sysexits.h; restarting cannot cure it, so a supervisor
# does not restart such a child and exits with it.
EXIT_CONFIG = 78
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


def app_not_loaded(error: AppNotLoaded) -> int:
    """Log the one `start_failed` line for an app not loaded, naming what was tried; EXIT_CONFIG."""
    log.error(
        "start_failed",
        error=str(error.problem),
        target=error.target,
        module=error.module,
        attribute=error.attribute,
        app_dir=error.app_dir,
        detail=error.detail,
        where=error.where,
        exit_code=EXIT_CONFIG,
    )
    return EXIT_CONFIG
