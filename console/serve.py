"""`idempotent-workers console` and `idempotent-workers console token create|revoke`.

The CLI loads this module by name, so the framework never imports its console.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator, Sequence

import asyncpg
import structlog
import uvicorn
from fastapi import FastAPI
from uvicorn.config import LifespanType

from console.app import create_app
from console.settings import ConsoleSettings
from console.tokens import Role, Tokens
from consumers.runtime.http_limits import WireLimits, guarded
from consumers.runtime.listening import listening_socket
from consumers.settings import Settings
from dedupe import check_schema

log = structlog.get_logger(__name__)


def console_parser(base: ConsoleSettings | None = None) -> argparse.ArgumentParser:
    """The flags of `console`, their defaults from `base` (the IW_CONSOLE_* variables)."""
    base = base or ConsoleSettings()
    parser = argparse.ArgumentParser(
        prog="idempotent-workers console",
        description="Serve the operator console (web pages over the dlq and inspect"
        " commands, signed in with a token) until SIGTERM.",
        epilog="idempotent-workers console token create|revoke: the tokens that sign in"
        " (see console token --help).",
    )
    parser.add_argument("--host", default=base.host, help="default 127.0.0.1: this machine only")
    parser.add_argument("--port", type=int, default=base.port, help="0: any free port")
    parser.add_argument(
        "--queue",
        action="append",
        default=None,
        help="a work queue the first page shows (repeat; default IW_CONSOLE_QUEUES)",
    )
    parser.add_argument(
        "--metrics-url", action="append", default=None, help="a worker's /metrics, linked"
    )
    parser.add_argument(
        "--origin",
        action="append",
        default=None,
        help="another origin its pages are served from, e.g. a proxy's https://console.example"
        " (repeat; default IW_CONSOLE_ORIGINS): a POST from it is not refused",
    )
    return parser


def console_main(argv: Sequence[str], settings: Settings) -> int:
    if argv[:1] == ["token"]:
        return _token_main(argv[1:], settings)
    base = ConsoleSettings.from_env(os.environ)
    args = console_parser(base).parse_args(argv)
    console = ConsoleSettings(
        host=args.host,
        port=args.port,
        queues=tuple(args.queue) if args.queue else base.queues,
        metrics_urls=tuple(args.metrics_url) if args.metrics_url else base.metrics_urls,
        scan=base.scan,
        origins=tuple(args.origin) if args.origin else base.origins,
    )
    return asyncio.run(serve(console, settings))


def server_config(app: FastAPI, *, lifespan: LifespanType = "auto") -> uvicorn.Config:
    """uvicorn as `console` runs it: on httptools with the send API's head and body
    deadlines (`consumers.runtime.http_limits`, at their defaults), no access log, 5 s
    for requests in flight at a stop."""
    return uvicorn.Config(
        app,
        http=guarded(WireLimits()),
        lifespan=lifespan,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=5,
    )


async def serve(console: ConsoleSettings, settings: Settings) -> int:
    """Serve until SIGTERM or SIGINT."""
    conn = await asyncpg.connect(settings.database.url)
    try:
        await check_schema(conn, settings.database.schema)
    finally:
        await conn.close()
    app = create_app(settings, console)
    sock = listening_socket(console.host, console.port)  # a connect on the line below waits
    host, port = sock.getsockname()[:2]
    server = _Server(server_config(app))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop_soon)
    # A line a parent process (a test) waits for: the port is chosen and open.
    print(f"console: listening on http://{host}:{port}", flush=True)
    log.info("console_listening", host=host, port=port, queues=list(console.queues))
    try:
        await server.serve(sockets=[sock])
    finally:
        sock.close()
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, stopped by our handlers, so that SIGTERM ends it with exit code 0.

    (uvicorn's own handlers raise the signal again once it stopped: a clean
    stop would read as a crash.)
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop_soon(self) -> None:
        log.info("console_stopping")
        self.should_exit = True


def token_parser() -> argparse.ArgumentParser:
    """The flags of `console token` and of each of its actions."""
    parser = argparse.ArgumentParser(
        prog="idempotent-workers console token",
        description="The console's sign-in tokens, one live token a name.",
    )
    sub = parser.add_subparsers(dest="action", required=True, help="ACTION --help: its flags")
    said = "make a token for a name and print it: the only time it is shown"
    create = sub.add_parser("create", help=said, description=said)
    create.add_argument("--name", required=True, help="who holds it: the audit names them")
    create.add_argument(
        "--role",
        type=Role,
        choices=list(Role),
        default=Role.READ,
        help="read: look only; operator: also replay and archive (default %(default)s)",
    )
    said = "revoke a name's token: it stops working at once"
    revoke = sub.add_parser("revoke", help=said, description=said)
    revoke.add_argument("--name", required=True, help="whose token")
    return parser


def _token_main(argv: Sequence[str], settings: Settings) -> int:
    args = token_parser().parse_args(argv)
    return asyncio.run(_token(args, settings))


async def _token(args: argparse.Namespace, settings: Settings) -> int:
    conn = await asyncpg.connect(settings.database.url)
    try:
        await check_schema(conn, settings.database.schema)
        tokens = Tokens(settings.database.schema)
        if args.action == "create":
            try:
                print(await tokens.create(conn, args.name, args.role))
            except asyncpg.UniqueViolationError:
                print(f"console token: {args.name} has a live token: revoke it first")
                return 1
            return 0
        if await tokens.revoke(conn, args.name):
            print(f"console token: revoked {args.name}")
            return 0
        print(f"console token: {args.name} has no live token")
        return 1
    finally:
        await conn.close()
