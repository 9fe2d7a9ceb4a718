"""Limits before reading, as bytes on the wire: the body's at the push worker's limit, the head's
at the server. Raw sockets, so nothing between the test and the server fixes a request up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn

from consumers import Settings
from consumers.runtime.http_limits import LINGER_SECONDS
from dedupe import DbConnection
from ingress.api import create_app
from ingress.serve import serve_settings
from ingress.settings import IngressSettings
from tests.ingress_support import Served, serve_in_process

LIMITS = IngressSettings(
    queue="t.limits",
    max_request_bytes=2 * 1_048_576,
    max_header_bytes=8192,
    header_timeout_seconds=1.0,
    body_timeout_seconds=1.0,
    body_min_rate=100.0,
)
ANSWER_S = 10.0  # a refusal that reads nothing comes at once; this bounds a busy machine


def job_of_size(size: int, key: str = "k-1") -> bytes:
    """A valid push job of exactly `size` bytes of JSON (its title pads it)."""
    body: dict[str, object] = {
        "targets": [{"platform": "ios", "token": "ios-token-1"}],
        "idempotency_key": key,
    }
    bare = len(json.dumps({**body, "notification": {"title": ""}}, separators=(",", ":")))
    body["notification"] = {"title": "x" * (size - bare)}
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert len(raw) == size
    return raw


@pytest.fixture
async def served(db: DbConnection, settings: Settings) -> AsyncIterator[Served]:
    async with serve_in_process(db, settings.database, LIMITS) as s:
        yield s


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return await asyncio.open_connection(parts.hostname, parts.port)


async def answer_of(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status and the rest of what the server sent until it closed the connection."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_S)
    rest = await asyncio.wait_for(reader.read(), ANSWER_S)  # b"" only once the server closed
    return int(head[9:12]), head + rest


def post_head(served: Served, extra: str) -> bytes:
    return (
        f"POST /v1/messages HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {served.key}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    ).encode()


async def test_a_content_length_past_the_limit_is_413_before_a_byte_of_the_body_is_sent(
    served: Served, db: DbConnection
) -> None:
    reader, writer = await connect(served.url)
    writer.write(post_head(served, "Content-Length: 100000000\r\n"))  # 100 MB announced, 0 sent
    await writer.drain()
    status, answer = await answer_of(reader)
    writer.close()
    assert status == 413, answer
    assert b"connection: close" in answer.lower()
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["max_bytes"] == LIMITS.max_request_bytes
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0


async def test_a_chunked_body_is_refused_once_it_passes_the_limit(
    served: Served, db: DbConnection
) -> None:
    raw = job_of_size(16 * LIMITS.max_request_bytes)  # past what socket buffers hold
    reader, writer = await connect(served.url)
    writer.write(post_head(served, "Transfer-Encoding: chunked\r\n"))
    sent = 0

    async def pieces() -> None:
        """64 KiB chunks, as fast as the server reads, until it answers and closes."""
        nonlocal sent
        with contextlib.suppress(ConnectionError):
            for start in range(0, len(raw), 65536):
                piece = raw[start : start + 65536]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
                sent += len(piece)

    sending = asyncio.create_task(pieces())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_S)
    finally:
        sending.cancel()
        writer.close()
    assert int(head[9:12]) == 413, head
    assert sent < len(raw)  # refused while the body was still coming: never read whole
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0


async def test_a_request_at_the_limit_is_queued_and_one_byte_more_is_413(
    db: DbConnection, settings: Settings
) -> None:
    small = replace(LIMITS, max_request_bytes=4096)
    async with (
        serve_in_process(db, settings.database, small) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as http,
    ):
        auth = {"Authorization": f"Bearer {served.key}", "Content-Type": "application/json"}
        at = await http.post("/v1/messages", content=job_of_size(4096, "at"), headers=auth)
        past = await http.post("/v1/messages", content=job_of_size(4097, "past"), headers=auth)
    assert at.status_code == 202, at.text
    assert past.status_code == 413, past.text
    assert await db.fetchval("SELECT count(*) FROM outbox") == 1


async def test_a_job_the_worker_would_refuse_for_its_size_is_413(
    db: DbConnection, settings: Settings
) -> None:
    """One device's job larger than the worker's body limit: no part can hold it."""
    small = replace(LIMITS, max_body_bytes=1024)
    async with (
        serve_in_process(db, settings.database, small) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as http,
    ):
        auth = {"Authorization": f"Bearer {served.key}", "Content-Type": "application/json"}
        fits = await http.post("/v1/messages", content=job_of_size(1000, "fits"), headers=auth)
        big = await http.post("/v1/messages", content=job_of_size(2000, "big"), headers=auth)
    assert fits.status_code == 202, fits.text
    assert (big.status_code, big.json()["max_bytes"]) == (413, 1024), big.text
    assert await db.fetchval("SELECT count(*) FROM outbox") == 1


def test_the_doors_body_limit_is_the_workers_and_one_variable_moves_both() -> None:
    assert IngressSettings().max_body_bytes == Settings().worker.max_body_bytes
    env = {"IW_MAX_BODY_BYTES": "4096"}
    assert IngressSettings.from_env(env).max_body_bytes == 4096
    assert Settings.from_env(env).worker.max_body_bytes == 4096


async def test_a_head_past_the_header_limit_is_431_and_the_connection_closed(
    served: Served,
) -> None:
    reader, writer = await connect(served.url)
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: t\r\nX-Flood: ")
    flood = b"a" * 65536
    for _ in range(16):  # 1 MiB of one header line, never ended
        if reader.at_eof() or writer.is_closing():
            break
        writer.write(flood)
        try:
            await writer.drain()
        except ConnectionError:
            break  # the server closed it: what it answered is still in our buffer
    status, answer = await answer_of(reader)
    writer.close()
    assert status == 431, answer


async def test_a_head_that_trickles_is_408_and_closed_by_the_header_timeout(
    served: Served,
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()  # before the connection: the server's deadline starts with it
    reader, writer = await connect(served.url)
    head = post_head(served, "X-Slow: ")

    async def trickle() -> None:
        """One byte every tenth of the timeout: uvicorn alone would wait for ever."""
        with contextlib.suppress(ConnectionError):
            for byte in head:
                writer.write(bytes([byte]))
                await asyncio.sleep(LIMITS.header_timeout_seconds / 10)

    sending = asyncio.create_task(trickle())
    try:
        status, _ = await answer_of(reader)
    finally:
        sending.cancel()
    took = loop.time() - started
    writer.close()
    assert status == 408
    assert LIMITS.header_timeout_seconds <= took < LIMITS.header_timeout_seconds + ANSWER_S


async def test_uvicorn_alone_has_no_head_limit_which_is_why_serve_adds_one(
    settings: Settings, db: DbConnection
) -> None:
    """uvicorn's own httptools protocol reads a 1 MiB header line to the end: no 431.

    If this fails, uvicorn learnt a limit, and `consumers.runtime.http_limits` may go.
    """
    app = create_app(LIMITS, settings.database)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http="httptools", log_config=None))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.02)
        reader, writer = await connect(f"http://127.0.0.1:{sock.getsockname()[1]}")
        writer.write(b"GET /v1/messages/x HTTP/1.1\r\nHost: t\r\nX-Flood: " + b"a" * 2**20)
        writer.write(b"\r\nConnection: close\r\n\r\n")
        await writer.drain()
        status, _ = await answer_of(reader)
        writer.close()
    finally:
        server.should_exit = True
        await task
        sock.close()
    assert status == 401  # the whole head was read and handed to the app


async def test_a_body_that_stalls_is_408_and_the_connection_closed(served: Served) -> None:
    """A head announcing 1,000 bytes, 10 of them sent, then nothing: uvicorn waits for ever."""
    loop = asyncio.get_running_loop()
    reader, writer = await connect(served.url)
    writer.write(post_head(served, "Content-Length: 1000\r\n") + b'{"targets"')
    await writer.drain()
    sent = loop.time()  # the server's clock starts later: with the whole head
    status, answer = await answer_of(reader)
    took = loop.time() - sent
    writer.close()
    assert status == 408, answer
    assert took < LIMITS.body_timeout_seconds + 10 / LIMITS.body_min_rate + ANSWER_S


async def test_a_body_that_trickles_below_the_minimum_rate_is_408(served: Served) -> None:
    """One byte every tenth of the timeout: each byte moves the deadline by 10 ms only."""
    loop = asyncio.get_running_loop()
    raw = job_of_size(1000)
    reader, writer = await connect(served.url)
    writer.write(post_head(served, f"Content-Length: {len(raw)}\r\n"))
    await writer.drain()
    started = loop.time()

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for byte in raw:
                writer.write(bytes([byte]))
                await asyncio.sleep(LIMITS.body_timeout_seconds / 10)

    sending = asyncio.create_task(trickle())
    try:
        status, answer = await answer_of(reader)
    finally:
        sending.cancel()
    took = loop.time() - started
    writer.close()
    assert status == 408, answer
    # Every byte of the job would have taken 100 s; the deadline came after about 1 s.
    assert LIMITS.body_timeout_seconds <= took < 2 * LIMITS.body_timeout_seconds + ANSWER_S


async def test_a_body_at_a_fair_pace_is_read_whole_however_long_it_takes(
    served: Served, db: DbConnection
) -> None:
    """3,500 bytes at about 1,000 a second (the minimum is 100): 3.5 times the timeout."""
    raw = job_of_size(3500)
    reader, writer = await connect(served.url)
    writer.write(post_head(served, f"Content-Length: {len(raw)}\r\n"))
    for start in range(0, len(raw), 100):
        writer.write(raw[start : start + 100])
        await writer.drain()
        await asyncio.sleep(0.1)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_S)
    writer.close()
    assert int(head[9:12]) == 202, head
    assert await db.fetchval("SELECT count(*) FROM outbox") == 1


async def test_a_body_that_trickles_after_its_answer_is_closed_without_a_second_one(
    served: Served,
) -> None:
    """A wrong key is refused (401) before the body is read; the body then trickles on.

    uvicorn's keep-alive timer, armed by the answer, is cancelled by every byte."""
    loop = asyncio.get_running_loop()
    reader, writer = await connect(served.url)
    writer.write(
        b"POST /v1/messages HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    await writer.drain()
    started = loop.time()

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(1000):
                writer.write(b" ")
                await asyncio.sleep(LIMITS.body_timeout_seconds / 10)

    sending = asyncio.create_task(trickle())
    try:
        status, answer = await answer_of(reader)  # ends only once the server closed
    finally:
        sending.cancel()
    took = loop.time() - started
    writer.close()
    assert status == 401, answer
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    assert took < 2 * LIMITS.body_timeout_seconds + ANSWER_S


async def test_a_client_gone_before_its_body_ends_its_request_without_an_error_logged(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """Hung up mid-body, or closed by the body's deadline: a request, not a server error."""
    loop = asyncio.get_running_loop()
    caplog.set_level(logging.WARNING)
    for hangs_up in (True, False):
        reader, writer = await connect(served.url)
        writer.write(post_head(served, "Content-Length: 1000\r\n") + b'{"targets"')
        await writer.drain()
        if not hangs_up:
            status, _ = await answer_of(reader)  # the deadline's 408
            assert status == 408
        writer.close()
        deadline = loop.time() + LINGER_SECONDS + ANSWER_S
        while served.requests:  # the request's task, until it ends
            assert loop.time() < deadline, "the request never ended"
            await asyncio.sleep(0.02)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]


def test_the_body_pace_is_read_from_the_environment() -> None:
    env = {"IW_INGRESS_BODY_TIMEOUT": "12.5", "IW_INGRESS_BODY_MIN_RATE": "2048"}
    ingress = IngressSettings.from_env(env)
    assert (ingress.body_timeout_seconds, ingress.body_min_rate) == (12.5, 2048.0)


@pytest.mark.parametrize(
    "env",
    [
        {"IW_INGRESS_BODY_MIN_RATE": "0"},
        {"IW_INGRESS_BODY_TIMEOUT": "nan"},
        {"IW_INGRESS_HEADER_TIMEOUT": "-1"},
    ],
)
def test_a_pace_that_could_never_be_kept_or_checked_is_refused_at_start(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        serve_settings([])
    assert exited.value.code == 2
    assert "must be a positive number" in capsys.readouterr().err
