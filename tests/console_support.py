"""The console for its tests: served in-process or as `idempotent-workers console`, with
tokens, and dead letters made by the real worker (`tests.apps.effects`)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import uvicorn

from console import ConsoleSettings, Role, Tokens, create_app
from console.serve import server_config
from consumers import Settings, dead_letter_queue
from dedupe import DbConnection
from proving.deadlines import ANSWER_S, within
from tests.support import ROOT, publish_confirmed, wait_for


@asynccontextmanager
async def console_in_process(settings: Settings, queue: str) -> AsyncIterator[str]:
    """uvicorn on 127.0.0.1, port chosen by the kernel; its base URL; stopped on exit."""
    async with console_server(settings, queue) as (url, _):
        yield url


@asynccontextmanager
async def console_server(
    settings: Settings, queue: str
) -> AsyncIterator[tuple[str, uvicorn.Server]]:
    """`console_in_process`, with the server (its `server_state.tasks`: the requests running)."""
    app = create_app(settings, ConsoleSettings(queues=(queue,)))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(server_config(app, lifespan="on"))  # the console's own
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # a failed start raises here
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        await within(ANSWER_S, "the console server to exit", task)
        sock.close()


@contextmanager
def console_process(env: dict[str, str], queue: str, log: Path) -> Iterator[str]:
    """`python -m consumers console --port 0 --queue QUEUE`; its base URL; SIGTERMed on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "consumers", "console", "--port", "0", "--queue", queue],
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=out,
        )
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 30)  # the line printed once bound
            assert ready, f"the console printed nothing within 30 s: {log.read_text()}"
            line = proc.stdout.readline().decode()
            assert line.startswith("console: listening on "), (line, log.read_text())
            yield line.removeprefix("console: listening on ").strip()
        finally:
            proc.terminate()
            try:
                code = proc.wait(timeout=15)
                assert code == 0, f"the console exited {code} on SIGTERM: {log.read_text()}"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError("the console did not stop within 15 s of SIGTERM") from None
            finally:
                if proc.stdout is not None:
                    proc.stdout.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class SignIns:
    """Two tokens: one with each role."""

    operator: str
    read: str


async def make_tokens(db: DbConnection, schema: str) -> SignIns:
    tokens = Tokens(schema)
    return SignIns(
        operator=await tokens.create(db, "olivia", Role.OPERATOR),
        read=await tokens.create(db, "rhea", Role.READ),
    )


async def publish(
    channel: aio_pika.abc.AbstractChannel,
    queue: str,
    message_id: str,
    body: object,
    headers: dict[str, object] | None = None,
) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    await publish_confirmed(
        channel,
        aio_pika.Message(
            raw,
            message_id=message_id,
            content_type="application/json",
            headers=headers or {},  # type: ignore[arg-type]
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        ),
        queue,
    )


async def held(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(dead_letter_queue(queue), passive=True)
    return declared.declaration_result.message_count or 0


async def wait_held(channel: aio_pika.abc.AbstractChannel, queue: str, n: int) -> None:
    async def holding() -> bool:
        return await held(channel, queue) == n

    try:
        await wait_for(holding, timeout=60)
    except AssertionError:
        raise AssertionError(
            f"{dead_letter_queue(queue)} holds {await held(channel, queue)}, not {n}"
        ) from None


async def effects_of(db: DbConnection, message_id: str) -> int:
    found = await db.fetchval("SELECT count(*) FROM effects WHERE message_id = $1", message_id)
    assert isinstance(found, int)
    return found
