"""`idempotent-workers serve` and `idempotent-workers api-key create --tenant T`.

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

import asyncpg
import structlog
import uvicorn
from fastapi import FastAPI

from consumers import Settings
from dedupe import check_schema
from ingress.api import create_app
from ingress.keys import ApiKeys
from ingress.settings import IngressSettings

log = structlog.get_logger(__name__)


def serve_main(argv: Sequence[str], settings: Settings) -> int:
    ingress = serve_settings(argv)
    return run(serve(ingress, create_app(ingress, settings.database)))


def serve_settings(argv: Sequence[str], prog: str = "idempotent-workers serve") -> IngressSettings:
    """The flags of `serve`, over the IW_INGRESS_* variables (the flags win)."""
    parser = argparse.ArgumentParser(prog=prog)
    base = IngressSettings.from_env(os.environ)
    parser.add_argument("--host", default=base.host)
    parser.add_argument("--port", type=int, default=base.port, help="0: any free port")
    parser.add_argument("--queue", default=base.queue, help="the push queue jobs go to")
    parser.add_argument("--max-batch", type=int, default=base.max_batch)
    parser.add_argument("--lanes", type=int, default=base.lanes)
    args = parser.parse_args(argv)
    return replace(
        base,
        host=args.host,
        port=args.port,
        queue=args.queue,
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
    """Serve `app` until SIGTERM or SIGINT: stop accepting, finish what is in flight, exit 0."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ingress.host, ingress.port))
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        http="httptools",
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=10,
        backlog=2048,
    )
    server = _Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop_soon)
    # A line a parent process (tests, bench, demo) waits for: the port is chosen now.
    print(f"serve: listening on http://{host}:{port}", flush=True)
    log.info("ingress_listening", host=host, port=port, queue=ingress.queue)
    await server.serve(sockets=[sock])
    return 0


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


def api_key_main(argv: Sequence[str], settings: Settings) -> int:
    parser = argparse.ArgumentParser(prog="idempotent-workers api-key")
    sub = parser.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="make a key for a tenant; it is printed once")
    create.add_argument("--tenant", required=True)
    args = parser.parse_args(argv)
    key = asyncio.run(_create_key(settings, args.tenant))
    print(key)
    return 0


async def _create_key(settings: Settings, tenant: str) -> str:
    conn = await asyncpg.connect(settings.database.url)
    try:
        await check_schema(conn, settings.database.schema)
        return await ApiKeys(settings.database.schema).create(conn, tenant)
    finally:
        await conn.close()
