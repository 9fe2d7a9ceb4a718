"""The console for its tests: served in-process or as `idempotent-workers console`, with
tokens, and dead letters made by the real worker (`tests.apps.effects`)."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import httpx
import uvicorn

from console import ConsoleSettings, Role, Tokens, create_app
from console.serve import server_config
from consumers import Settings, dead_letter_queue
from consumers.broker.topology import declare
from consumers.pipeline.settle import DEAD_LETTERED_AT_HEADER
from dedupe import DbConnection
from proving.deadlines import ANSWER_S, within
from tests.apps.effects import FAST_RETRY
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
    message_id: str | None,
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


async def two_dead_letters(
    channel: aio_pika.abc.AbstractChannel, settings: Settings, queue: str
) -> None:
    """`queue` and its DLQ declared; `order-1` and `order-2` put straight into the DLQ."""
    await declare(channel, queue, FAST_RETRY, settings.amqp)
    now_ms = int(time.time() * 1000)
    for n in (1, 2):
        headers = {"x-reason": "held_back", DEAD_LETTERED_AT_HEADER: now_ms}
        await publish(channel, dead_letter_queue(queue), f"order-{n}", {"n": n}, headers)


async def signed_in(url: str, token: str) -> httpx.AsyncClient:
    """A client holding the session cookie of one sign-in at `/login`, as a browser would.

    Each call is a sign-in of its own (its own session), even with the same token."""
    http = httpx.AsyncClient(base_url=url, headers={"Origin": url})
    answer = await http.post("/login", data={"token": token})
    assert answer.status_code == 303, answer.text
    return http


_INTENT_FIELD = re.compile(r'name="intent" value="([A-Za-z0-9_-]+)"')


def intent_in(page: str) -> str:
    """The intent key a page's form carries."""
    found = _INTENT_FIELD.search(page)
    assert found, page
    return found[1]


_HIDDEN_FIELD = re.compile(r'type="hidden" name="([a-z_]+)" value="([^"]*)"')


def form_in(page: str) -> dict[str, str]:
    """The hidden fields of a page's form, as a browser would send them."""
    return {name: html.unescape(value) for name, value in _HIDDEN_FIELD.findall(page)}


def link_in(page: str, anchor_id: str) -> str:
    """Where the link `<a id="anchor_id">` of a page goes."""
    found = re.search(rf'<a id="{anchor_id}" href="([^"]+)"', page)
    assert found, page
    return html.unescape(found[1])


async def replayed_nothing(
    db: DbConnection, schema: str, channel: aio_pika.abc.AbstractChannel, queue: str, held_n: int
) -> None:
    """Nothing acted: no audit row, the DLQ holds what it held, the work queue is empty."""
    assert await db.fetchval(f'SELECT count(*) FROM "{schema}".console_actions') == 0
    assert await held(channel, queue) == held_n
    work = await channel.declare_queue(queue, passive=True)
    assert work.declaration_result.message_count == 0
