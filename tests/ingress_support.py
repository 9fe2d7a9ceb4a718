"""The send API served in-process over real HTTP on a free port, for the ingress tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn

from consumers import DatabaseSettings, WebhookSettings
from dedupe import DbConnection
from ingress.api import create_app
from ingress.keys import ApiKeys
from ingress.serve import server_config
from ingress.settings import IngressSettings
from proving.deadlines import ANSWER_S, within


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    url: str
    key: str  # tenant "acme"
    other_key: str  # tenant "globex"
    queue: str
    requests: set[asyncio.Task[None]]  # the server's requests in progress (uvicorn's own set)


@asynccontextmanager
async def serve_in_process(
    db: DbConnection,
    database: DatabaseSettings,
    settings: IngressSettings,
    *,
    webhook_settings: WebhookSettings | None = None,
) -> AsyncIterator[Served]:
    """uvicorn on 127.0.0.1, port chosen by the kernel; stopped on exit."""
    keys = ApiKeys(database.schema)
    key, other = await keys.create(db, "acme"), await keys.create(db, "globex")
    app = create_app(settings, database, webhook_settings=webhook_settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(server_config(app, settings))  # serve's own configuration
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # a failed start raises here
            await asyncio.sleep(0.02)
        yield Served(
            url=f"http://127.0.0.1:{port}",
            key=key,
            other_key=other,
            queue=settings.queue,
            requests=server.server_state.tasks,
        )
    finally:
        server.should_exit = True
        await within(ANSWER_S, "the send API server to exit", task)
        sock.close()
