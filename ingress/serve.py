"""`idempotent-workers serve`, and `api-key` (`ingress.key_commands`).

The CLI loads this module by name, so the framework never imports ingress.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import socket
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import replace
from typing import Any

import structlog
import uvicorn
from fastapi import FastAPI
from uvicorn.config import LifespanType

from consumers import ConfigurationError, Settings
from consumers.runtime.http_limits import WireLimits, guarded
from consumers.runtime.listening import BACKLOG, listening_socket
from consumers.telemetry.failed_start import EXIT_CONFIG, START_FAILURES, start_failed
from ingress.api import create_app
from ingress.key_commands import api_key_main
from ingress.settings import IngressSettings

log = structlog.get_logger(__name__)

__all__ = [
    "api_key_main",
    "run",
    "serve",
    "serve_main",
    "serve_parser",
    "serve_settings",
    "server_config",
]


def serve_main(argv: Sequence[str], settings: Settings) -> int:
    ingress = serve_settings(argv, settings)
    try:
        app = create_app(ingress, settings.database, webhook_settings=settings.webhooks)
    except ConfigurationError as refused:  # IW_WEBHOOK_SECRETS_KEY set, but no Fernet key
        log.error("start_failed", error="configuration", detail=str(refused), exit_code=EXIT_CONFIG)
        return EXIT_CONFIG
    return run(serve(ingress, app))


def serve_parser(
    base: IngressSettings | None = None, prog: str = "idempotent-workers serve"
) -> argparse.ArgumentParser:
    """The flags of `serve`, their defaults from `base` (the IW_INGRESS_* variables)."""
    base = base or IngressSettings()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve the HTTP send API (POST /v1/messages, /v1/webhooks, /v1/emails,"
        " with an API key) until SIGTERM: each accepted job is stored and relayed to its"
        " kind's queue. Flags win over the IW_INGRESS_* variables.",
    )
    parser.add_argument("--host", default=base.host, help="default %(default)s")
    parser.add_argument(
        "--port", type=int, default=base.port, help="default %(default)s; 0: any free port"
    )
    parser.add_argument(
        "--queue", default=base.queue, help="the push queue jobs go to (default %(default)s)"
    )
    parser.add_argument(
        "--webhook-queue",
        default=base.webhook_queue,
        help="the webhook queue webhook jobs go to (default %(default)s: POST /v1/webhooks"
        " answers 501)",
    )
    parser.add_argument(
        "--email-queue",
        default=base.email_queue,
        help="the e-mail queue e-mail jobs go to (default %(default)s: POST /v1/emails"
        " answers 501)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=base.max_batch,
        help="requests in one commit at most (default %(default)s)",
    )
    parser.add_argument(
        "--lanes",
        type=int,
        default=base.lanes,
        help="commits in flight at once (default %(default)s)",
    )
    return parser


def serve_settings(
    argv: Sequence[str], settings: Settings | None = None, prog: str = "idempotent-workers serve"
) -> IngressSettings:
    """The flags of `serve`, over the IW_INGRESS_* variables (the flags win); the Web Push
    hosts the workers allow from `settings` (the CLI's: IW_WEBPUSH_ALLOW_HOSTS)."""
    try:
        base = IngressSettings.from_env(os.environ)
    except ValueError as exc:  # a variable that is no number, or out of range
        serve_parser(prog=prog).error(f"IW_INGRESS_* variables: {exc}")
    args = serve_parser(base, prog).parse_args(argv)
    return replace(
        base,
        host=args.host,
        port=args.port,
        queue=args.queue,
        webhook_queue=args.webhook_queue or None,
        email_queue=args.email_queue or None,
        webpush_allow_hosts=(settings or Settings()).worker.webpush_allow_hosts,
        max_batch=args.max_batch,
        lanes=args.lanes,
    )


def run(main: Coroutine[Any, Any, int]) -> int:
    """Run `main` on uvloop (the serve extra brings it), or on the default loop without it."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


async def serve(ingress: IngressSettings, app: FastAPI) -> int:
    """Serve `app` until SIGTERM or SIGINT: stop accepting, finish what is in flight, exit 0.

    The app's lifespan (the pool, the schema check) runs here, around the
    server, rather than inside uvicorn, which would log a failed start as a
    traceback: a start the database or the port failed is one `start_failed`
    line and EXIT_START_FAILED, as for `run`.
    """
    server = _Server(server_config(app, ingress, lifespan="off"))  # the lifespan: below
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop_soon)
    async with contextlib.AsyncExitStack() as started:
        try:
            sock = started.enter_context(listening_socket(ingress.host, ingress.port))
            await started.enter_async_context(app.router.lifespan_context(app))
        except START_FAILURES as error:
            return start_failed(error)
        host, port = sock.getsockname()[:2]
        # A line a parent process (tests, bench, demo) waits for: the port chosen, the pool open.
        print(f"serve: listening on http://{host}:{port}", flush=True)
        log.info(
            "ingress_listening",
            host=host,
            port=port,
            queue=ingress.queue,
            webhook_queue=ingress.webhook_queue,
            email_queue=ingress.email_queue,
        )
        await server.serve(sockets=[sock])
    return 0


def server_config(
    app: FastAPI, ingress: IngressSettings, *, lifespan: LifespanType = "auto"
) -> uvicorn.Config:
    """uvicorn on httptools, with the head and body limits uvicorn lacks
    (`consumers.runtime.http_limits`)."""
    limits = WireLimits(
        max_header_bytes=ingress.max_header_bytes,
        header_timeout_seconds=ingress.header_timeout_seconds,
        body_timeout_seconds=ingress.body_timeout_seconds,
        body_min_rate=ingress.body_min_rate,
    )
    return uvicorn.Config(
        app,
        http=guarded(limits),
        lifespan=lifespan,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=10,
        backlog=BACKLOG,
    )


class _Server(uvicorn.Server):
    """uvicorn's server, stopped by our handlers: a SIGTERM ends it with exit code 0.

    (uvicorn's own handlers raise the signal again once it stopped, so the
    process would die of it: a clean stop would read as a crash.)
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop_soon(self) -> None:
        log.info("ingress_stopping")
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # What exists now (modules, the app, the pool) lives as long as the
        # process: frozen out of the collector's sight, a full collection no
        # longer walks it. Measured in-process: one full collection of the
        # started app's 74,000 objects stalled every request for 28 ms.
        gc.freeze()
