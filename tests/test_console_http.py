"""The console over HTTP: tokens and roles, and an intent key acting once.

Dead letters are put straight into the DLQ (as in tests/test_deadletters.py);
the browser tests have the real worker make them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import aio_pika
import httpx
import pytest
import uvicorn

from console import serve as serve_module
from console.settings import ConsoleSettings
from consumers import Settings, dead_letter_queue
from consumers.broker.topology import declare
from consumers.pipeline.settle import DEAD_LETTERED_AT_HEADER
from consumers.runtime.http_limits import LINGER_SECONDS
from dedupe import DbConnection, Messages, NewMessage, fingerprint, job_message_id
from proving.deadlines import ANSWER_S
from tests.apps.effects import FAST_RETRY
from tests.conftest import AMQP_URL, DATABASE_URL
from tests.console_support import (
    console_in_process,
    console_process,
    console_server,
    form_in,
    held,
    link_in,
    make_tokens,
    publish,
    signed_in,
    two_dead_letters,
    wait_held,
)
from tests.support import ROOT


async def _topology(channel: aio_pika.abc.AbstractChannel, settings: Settings, queue: str) -> None:
    await declare(channel, queue, FAST_RETRY, settings.amqp)
    now_ms = int(time.time() * 1000)
    for n in (1, 2):
        headers = {"x-reason": "held_back", DEAD_LETTERED_AT_HEADER: now_ms}
        await publish(channel, dead_letter_queue(queue), f"order-{n}", {"n": n}, headers)


LISTENING = re.compile(r"console: listening on http://[\d.]+:(\d+)")


def _intent(page: str) -> str:
    found = re.search(r'name="intent" value="([A-Za-z0-9_-]+)"', page)
    assert found, page
    return found[1]


async def test_a_resubmitted_form_replays_once_and_a_read_only_token_cannot_replay(
    db: DbConnection,
    schema: str,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
) -> None:
    await _topology(channel, settings, queue_name)
    tokens = await make_tokens(db, schema)
    async with (
        console_in_process(settings, queue_name) as url,
        httpx.AsyncClient(base_url=url, headers={"Origin": url}) as http,
    ):
        as_reader = {"Authorization": f"Bearer {tokens.read}"}
        as_operator = {"Authorization": f"Bearer {tokens.operator}"}
        dry = await http.get("/replay", params={"queue": queue_name}, headers=as_reader)
        assert dry.status_code == 200 and "Read-only token" in dry.text
        form = {
            "queue": queue_name,
            "intent": _intent(
                (await http.get("/replay", params={"queue": queue_name}, headers=as_operator)).text
            ),
        }

        refused = await http.post("/replay", data=form, headers=as_reader)
        assert refused.status_code == 403
        assert await held(channel, queue_name) == 2
        assert await db.fetchval(f'SELECT count(*) FROM "{schema}".console_actions') == 0

        answers = await asyncio.gather(
            *(http.post("/replay", data=form, headers=as_operator) for _ in range(2))
        )
        again = await http.post("/replay", data=form, headers=as_operator)  # resubmitted later
        for answer in (*answers, again):
            assert answer.status_code == 303
            assert answer.headers["location"] == f"/actions/{form['intent']}"
        assert await db.fetchval(f'SELECT count(*) FROM "{schema}".console_actions') == 1
        outcomes = await db.fetch(
            f'SELECT message_id, outcome FROM "{schema}".console_action_messages ORDER BY n'
        )
        assert [tuple(r) for r in outcomes] == [("order-1", "replayed"), ("order-2", "replayed")]
        assert await held(channel, queue_name) == 0
        work = await channel.declare_queue(queue_name, passive=True)
        assert work.declaration_result.message_count == 2  # once each, not twice

        shown = await http.get(f"/actions/{form['intent']}", headers=as_operator)
        assert shown.status_code == 200 and shown.text.count(">replayed<") == 2


async def test_a_page_without_a_live_token_asks_to_sign_in(
    db: DbConnection, schema: str, settings: Settings, queue_name: str
) -> None:
    tokens = await make_tokens(db, schema)
    async with (
        console_in_process(settings, queue_name) as url,
        httpx.AsyncClient(base_url=url, headers={"Origin": url}) as http,
    ):
        assert (await http.get("/")).headers["location"] == "/login"
        bad = await http.post("/login", data={"token": "iwc_made_up"})
        assert bad.status_code == 401
        good = await http.post("/login", data={"token": tokens.read})
        assert good.status_code == 303 and "HttpOnly" in good.headers["set-cookie"]
        assert "SameSite=strict" in good.headers["set-cookie"]
        assert (await http.get("/actions")).status_code == 200  # the cookie signs in
        revoked = subprocess.run(
            [sys.executable, "-m", "consumers", "console", "token", "revoke", "--name", "rhea"],
            env={
                "AMQP_URL": AMQP_URL,
                "DATABASE_URL": DATABASE_URL,
                "DATABASE_SCHEMA": schema,
                "PATH": "/usr/bin",
            },
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert revoked.returncode == 0, revoked.stderr
        assert (await http.get("/actions")).headers["location"] == "/login"


async def test_a_form_past_its_limit_is_413_before_its_body_is_read(
    db: DbConnection, schema: str, settings: Settings, queue_name: str
) -> None:
    """/login reads its form before anyone is signed in: 100 MB announced, or streamed."""
    async with console_in_process(settings, queue_name) as url:
        port = int(url.rsplit(":", 1)[1])
        head = (
            "POST /login HTTP/1.1\r\nHost: t\r\nOrigin: http://t\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"{head}Content-Length: 100000000\r\n\r\ntoken=".encode())
        announced = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_S)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
        piece = b"a" * 65536
        sent = 0

        async def pieces() -> None:
            nonlocal sent
            with contextlib.suppress(ConnectionError):
                for _ in range(1600):  # 100 MiB, unless the answer comes first
                    writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    await writer.drain()
                    sent += len(piece)

        sending = asyncio.create_task(pieces())
        try:
            streamed = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_S)
        finally:
            sending.cancel()
            writer.close()
    assert int(announced[9:12]) == 413, announced
    assert int(streamed[9:12]) == 413, streamed
    assert sent < 1600 * len(piece)


async def test_the_console_has_the_send_apis_head_limit(
    settings: Settings, queue_name: str
) -> None:
    """One header line past 32 KiB: 431 and closed (`consumers.runtime.http_limits`)."""
    async with console_in_process(settings, queue_name) as url:
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /login HTTP/1.1\r\nHost: t\r\nX-Flood: " + b"a" * 40_000)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_S)
        writer.close()
    assert int(head[9:12]) == 431, head


async def test_a_client_gone_mid_form_ends_its_request_without_an_error_logged(
    db: DbConnection,
    schema: str,
    settings: Settings,
    queue_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hung up before its form ended: a request nobody reads the answer of, not a
    server error with Starlette's traceback."""
    caplog.set_level(logging.WARNING)
    loop = asyncio.get_running_loop()
    async with console_server(settings, queue_name) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /login HTTP/1.1\r\nHost: t\r\nOrigin: http://t\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\n"
            b"token="
        )
        await writer.drain()
        running = server.server_state.tasks  # the requests' tasks, from each one's head
        deadline = loop.time() + ANSWER_S
        while not running:
            assert loop.time() < deadline, "the request never started"
            await asyncio.sleep(0.02)
        writer.close()
        deadline = loop.time() + LINGER_SECONDS + ANSWER_S
        while running:
            assert loop.time() < deadline, "the request never ended"
            await asyncio.sleep(0.02)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]


async def test_the_console_command_serves_this_machine_only_with_a_token_the_cli_made(
    db: DbConnection, schema: str, queue_name: str, tmp_path: Path
) -> None:
    env = {"AMQP_URL": AMQP_URL, "DATABASE_URL": DATABASE_URL, "DATABASE_SCHEMA": schema}
    made = subprocess.run(
        [sys.executable, "-m", "consumers", "console", "token", "create", "--name", "ines"],
        env={**env, "PATH": "/usr/bin"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("iwc_")
    stored = await db.fetchrow(f'SELECT token_hash, role FROM "{schema}".console_tokens')
    assert stored is not None and stored["role"] == "read"
    assert token.encode() not in bytes(stored["token_hash"])  # only its hash is kept
    with console_process(env, queue_name, tmp_path / "console.log") as url:
        assert url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=url, headers={"Origin": url}) as http:
            page = await http.get("/", headers={"Authorization": f"Bearer {token}"})
            assert page.status_code == 200 and queue_name in page.text
            assert page.headers["content-security-policy"].startswith("default-src 'none'")


async def test_archive_keeps_each_message_before_it_leaves_the_dlq_once_per_intent(
    db: DbConnection,
    schema: str,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
) -> None:
    await _topology(channel, settings, queue_name)
    tokens = await make_tokens(db, schema)
    async with (
        console_in_process(settings, queue_name) as url,
        httpx.AsyncClient(base_url=url, headers={"Origin": url}) as http,
    ):
        as_operator = {"Authorization": f"Bearer {tokens.operator}"}
        asked = await http.get(
            "/archive", params={"queue": queue_name, "message_id": "order-2"}, headers=as_operator
        )
        assert asked.status_code == 200 and 'name="confirm"' in asked.text
        form = {"queue": queue_name, "message_id": "order-2", "intent": _intent(asked.text)}
        refused = await http.post(
            "/archive", data=form, headers={"Authorization": f"Bearer {tokens.read}"}
        )
        assert refused.status_code == 403 and await held(channel, queue_name) == 2
        unconfirmed = await http.post("/archive", data=form, headers=as_operator)
        assert unconfirmed.status_code == 400 and await held(channel, queue_name) == 2
        assert await db.fetchval(f'SELECT count(*) FROM "{schema}".console_actions') == 0
        for _ in range(2):
            done = await http.post("/archive", data={**form, "confirm": "1"}, headers=as_operator)
            assert done.headers["location"] == f"/actions/{form['intent']}"
        # order-1 stays: the console took it from the queue and gave it back (a requeue
        # the broker counts as ready once it has processed it, not at the 303).
        await wait_held(channel, queue_name, 1)
        kept = await db.fetch(
            "SELECT a.action, a.actor, m.message_id, m.outcome, m.body"
            f' FROM "{schema}".console_actions a'
            f' JOIN "{schema}".console_action_messages m USING (intent_key)'
        )
        assert [tuple(r) for r in kept] == [
            ("archive", "olivia", "order-2", "archived", b'{"n": 2}')
        ]


async def test_a_send_api_jobs_page_shows_its_key_message_and_outbox_rows(
    db: DbConnection,
    schema: str,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
) -> None:
    await declare(channel, queue_name, FAST_RETRY, settings.amqp)
    job = {"targets": [{"platform": "ios", "token": "t-1"}]}
    accepted = await Messages(schema).accept(
        db,
        [
            NewMessage(
                tenant="acme",
                idempotency_key="key-<1>",
                fingerprint=fingerprint(job),
                queue=queue_name,
                targets=1,
                job=json.dumps(job).encode(),
            )
        ],
    )
    assert accepted[0].id is not None
    job_id = job_message_id(accepted[0].id)
    tokens = await make_tokens(db, schema)
    async with (
        console_in_process(settings, queue_name) as url,
        httpx.AsyncClient(base_url=url, headers={"Origin": url}) as http,
    ):
        page = await http.get(
            "/message",
            params={"queue": queue_name, "message_id": job_id, "tenant": "acme"},
            headers={"Authorization": f"Bearer {tokens.read}"},
        )
    assert page.status_code == 200
    assert "key-&lt;1&gt;" in page.text and str(accepted[0].id) in page.text
    assert "queued" in page.text and "No outbox rows" not in page.text


async def test_the_console_accepts_connections_once_it_says_it_is_listening(
    db: DbConnection,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The line a parent waits for is printed once a connect to the port succeeds, however
    late uvicorn starts (a busy machine): here its start is held until the connect is tried."""
    connected = asyncio.Event()
    original = serve_module._Server.serve

    async def held(self: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        await connected.wait()
        await original(self, sockets=sockets)

    monkeypatch.setattr(serve_module._Server, "serve", held)
    server = asyncio.create_task(serve_module.serve(ConsoleSettings(port=0), settings))
    try:
        printed = ""
        async with asyncio.timeout(ANSWER_S):
            while (said := LISTENING.search(printed)) is None:
                await asyncio.sleep(0.01)
                printed += capsys.readouterr().out
        _, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", int(said.group(1))), ANSWER_S
        )
        writer.close()
        await writer.wait_closed()
    finally:
        connected.set()
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server


async def test_the_action_page_links_back_to_its_queue_and_its_message(
    db: DbConnection,
    schema: str,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
) -> None:
    await two_dead_letters(channel, settings, queue_name)
    tokens = await make_tokens(db, schema)
    async with console_in_process(settings, queue_name) as url:
        http = await signed_in(url, tokens.operator)
        try:
            shown = await http.get(
                "/message", params={"queue": queue_name, "message_id": "order-1"}
            )
            dry = await http.get(link_in(shown.text, "dry-run"))
            done = await http.post("/replay", data=form_in(dry.text))
            assert done.status_code == 303, done.text
            action = await http.get(done.headers["location"])
            to_queue = link_in(action.text, "back-to-queue")
            to_message = link_in(action.text, "back-to-message")
            assert to_queue == f"/letters?queue={queue_name}"
            listed = await http.get(to_queue)
            assert listed.status_code == 200 and "order-2" in listed.text
            again = await http.get(to_message)
            assert again.status_code == 200
            assert "order-1" in again.text and "0 copies in the DLQ" in again.text
            outcomes = action.text[action.text.index('id="outcomes"') :]
            assert '<a href="/message?' in outcomes  # each message of the action, linked
        finally:
            await http.aclose()
