"""One worker process, as `idempotent-workers run` starts it: until SIGTERM or SIGINT.

1. signal handlers first: a stop asked for while starting abandons the start;
2. the heartbeat (liveness and readiness, `consumers.telemetry.health`) and, when
   IW_METRICS_PORT is set, the endpoint serving it with the metrics, before
   the worker starts: a worker slow to reach its services is live, not ready;
3. the watchdog (`consumers.runtime.watchdog`): a handler blocking the event loop
   past its deadline plus the grace ends the process, non-zero;
4. start the worker, consume until the signal, stop it (settle, ack, close),
   the garbage collector set for work in flight (`consumers.runtime.collector`).
   A start a service failed exits EXIT_START_FAILED (3: a restart may cure
   it) with one `start_failed` line (`consumers.telemetry.failed_start`, as
   `relay` and `serve` do); one the configuration refuses (a queue that
   exists with other arguments) exits EXIT_CONFIG (78) with one such line,
   as does a MODULE:APP that gives no App (said by the CLI, which catches
   `AppNotLoaded`: `consumers.telemetry.failed_start.app_not_loaded`).

Under a supervisor (`run --processes N`) the same runs in each child, without
a port of its own: its metrics and health go to the supervisor through
PROMETHEUS_MULTIPROC_DIR (see consumers.runtime.supervisor).
"""

from __future__ import annotations

import asyncio
import signal

import structlog

from consumers.broker.conflicts import TopologyConflict
from consumers.effects.lease import LeaseTooShort
from consumers.handlers.loading import load_app
from consumers.message.decisions import ConfigurationError
from consumers.retention.cleaner import clean_periodically
from consumers.retention.retry_horizon import check_retention, retention_need
from consumers.runtime.collector import collect_less, freeze_started
from consumers.runtime.replication import ReplicationRefused
from consumers.runtime.watchdog import Watchdog
from consumers.runtime.worker import Worker
from consumers.settings import Settings
from consumers.telemetry.endpoint import Endpoint
from consumers.telemetry.failed_start import EXIT_CONFIG, START_FAILURES, start_failed
from consumers.telemetry.health import Heartbeat
from consumers.telemetry.metrics import DedupeCollector
from dedupe import TableStats

log = structlog.get_logger(__name__)

SCRAPE_READ_SECONDS = 3.0  # how long a scrape waits for the dedupe table's figures


async def run_process(target: str, settings: Settings, *, app_dir: str = ".") -> int:
    """Run `target`'s handlers until SIGTERM; its exit status (see above).

    Raises `AppNotLoaded` when `target`, searched in `app_dir` first, gives no
    App: the CLI says so in one `start_failed` line and exits EXIT_CONFIG.
    """
    app = load_app(target, app_dir=app_dir)
    # Before anything starts: a retention the retry policies outlive is refused.
    check_retention(
        settings.retention.keep, retention_need(app.specs, settings.retention, app.retry)
    )
    worker = Worker(app, settings)
    collect_less()
    # Handlers go in before start(), which can take a while when a service is
    # slow to answer: a SIGTERM then abandons the start and closes what it opened.
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    heartbeat = Heartbeat(worker.readiness, worker.metrics)
    beating = asyncio.create_task(heartbeat.run(), name="heartbeat")
    watchdog = Watchdog(worker.stuck_after)
    watchdog.start()
    endpoint = _serve(worker, heartbeat, loop) if settings.metrics.port is not None else None
    starting = asyncio.create_task(worker.start())
    waiting = asyncio.create_task(stop_requested.wait())
    cleaning = (  # opt-in: IW_CLEANUP_INTERVAL
        asyncio.create_task(clean_periodically(settings), name="cleanup")
        if settings.retention.cleanup_interval_seconds
        else None
    )
    try:
        done, _ = await asyncio.wait({starting, waiting}, return_when=asyncio.FIRST_COMPLETED)
        # A failed start that lands in the same turn of the loop as SIGTERM is
        # an abandoned start too: the stop was asked for, the exit is 0.
        if starting in done and not stop_requested.is_set():
            if isinstance(conflict := starting.exception(), TopologyConflict):
                # One line that says what to change; the traceback would say nothing more.
                log.error(
                    "start_failed",
                    error="topology_conflict",
                    queue=conflict.queue,
                    declared=conflict.declared,
                    refused=conflict.refused,
                    existing=conflict.existing,
                    exit_code=EXIT_CONFIG,
                )
                return EXIT_CONFIG
            if isinstance(short := starting.exception(), LeaseTooShort):
                # No send could ever start under these settings: the line says which to change.
                log.error(
                    "start_failed",
                    error="lease_too_short",
                    detail=str(short),
                    exit_code=EXIT_CONFIG,
                )
                return EXIT_CONFIG
            if isinstance(refused := starting.exception(), ReplicationRefused):
                log.error(
                    "start_failed",
                    error="commits_not_replicated",
                    detail=str(refused),
                    exit_code=EXIT_CONFIG,
                )
                return EXIT_CONFIG
            if isinstance(refused := starting.exception(), ConfigurationError):
                # A setting the app cannot work without (a webhook queue with no
                # IW_WEBHOOK_SECRETS_KEY): the line says which.
                log.error(
                    "start_failed",
                    error="configuration",
                    detail=str(refused),
                    exit_code=EXIT_CONFIG,
                )
                return EXIT_CONFIG
            if isinstance(error := starting.exception(), START_FAILURES):
                # A service down or a connection cut while starting (maybe with
                # a first queue consuming already): not a stop that failed.
                return start_failed(error)
            starting.result()  # any other failed start raises here
            freeze_started()
            await waiting  # consume until SIGTERM or SIGINT
        elif not (starting.done() and starting.exception() is None):
            log.info("start_abandoned", reason="stop requested while starting")
            starting.cancel()
            try:
                await starting
            except asyncio.CancelledError:
                pass
            except Exception as exc:
                # Cut short inside a library call (a channel half open, say),
                # a start can end in that step's error rather than the
                # cancellation: the stop was asked for, so it is not a failure.
                log.info("start_abandoned_with_error", error=f"{type(exc).__name__}: {exc}")
    finally:
        waiting.cancel()
        if cleaning is not None:
            cleaning.cancel()
        await worker.stop()
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        if endpoint is not None:
            endpoint.close()
        watchdog.stop()
    return 0


def _serve(worker: Worker, heartbeat: Heartbeat, loop: asyncio.AbstractEventLoop) -> Endpoint:
    """The endpoint on IW_METRICS_PORT; the dedupe figures are read in the worker's loop."""

    def read() -> TableStats | None:
        future = asyncio.run_coroutine_threadsafe(worker.table_stats(), loop)
        try:
            return future.result(timeout=SCRAPE_READ_SECONDS)
        except TimeoutError:
            future.cancel()
            return None

    registry = worker.metrics.registry
    registry.register(DedupeCollector(read))
    metrics = worker.settings.metrics
    assert metrics.port is not None
    return Endpoint(registry, heartbeat, host=metrics.host, port=metrics.port).start()
