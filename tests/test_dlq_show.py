"""`dlq show` prints what the worker dead-lettered readably, and nothing a terminal acts on.

A real worker dead-letters three messages: a JSON body its handler rejects,
a JSON body whose strings hold an escape sequence, a carriage return, a bidi
override and NUL, and a body that is not JSON holding them raw. `dlq show`
runs as a real process; its bytes are read as a terminal would get them.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys

import aio_pika
import pytest

from dedupe import DbConnection
from proving.rawamqp import RawProperties, RawPublisher
from tests.conftest import AMQP_URL, DATABASE_URL, Spawn
from tests.support import ROOT, wait_declared, wait_for

PRETTY = b'{"order_id": 3001, "reject": "no_such_order"}'
# Valid JSON: the control characters are JSON escapes, the bidi override raw UTF-8.
HOSTILE_JSON = b'{"reject": "hostile", "note": "\\u001b[2J\\r' + "\u202e".encode() + b'\\u0000"}'
HOSTILE_RAW = b"\x1b[2J\r" + "\u202e".encode() + b"\x00 not json\nsecond line"
# What must never reach a terminal raw.
ACTED_ON = (b"\x1b", b"\r", b"\x00", "\u202e".encode(), b"\x07")


def show(queue: str, message_id: str, schema: str) -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "consumers", "dlq", "show", queue, message_id],
        env={
            "AMQP_URL": AMQP_URL,
            "DATABASE_URL": DATABASE_URL,
            "DATABASE_SCHEMA": schema,
            "PATH": "/usr/bin",
        },
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    return done.stdout


def body_of(shown: str) -> str:
    """The body lines `dlq show` printed, without their indent."""
    _, _, rest = shown.partition(" bytes):\n")
    return "\n".join(line.removeprefix("  ") for line in rest.rstrip("\n").split("\n"))


@pytest.fixture
async def dead_letters(
    db: DbConnection, queue_name: str, spawn: Spawn, channel: aio_pika.abc.AbstractChannel
) -> tuple[str, datetime.datetime]:
    """`queue_name` with the three dead letters, put there by a worker; when they were sent."""
    worker = spawn()
    await wait_declared(AMQP_URL, queue_name)
    sent = datetime.datetime.now(datetime.UTC)
    async with await RawPublisher.connect_url(AMQP_URL) as raw:
        for message_id, body in (
            ("pretty", PRETTY),
            ("hostile-json", HOSTILE_JSON),
            ("hostile-raw", HOSTILE_RAW),
        ):
            raw.send(queue_name, body, RawProperties(message_id=message_id))
        await raw.confirm()

    async def all_dead() -> bool:
        declared = await channel.declare_queue(f"{queue_name}.dlq", passive=True)
        return declared.declaration_result.message_count == 3

    await wait_for(all_dead, timeout=60)
    worker.terminate()
    await worker.expect_exit(0)
    return queue_name, sent


async def test_show_pretty_prints_a_json_body_with_real_newlines_and_iso_times(
    dead_letters: tuple[str, datetime.datetime], schema: str
) -> None:
    queue, sent = dead_letters
    shown = show(queue, "pretty", schema).decode()
    assert (
        f"body ({len(PRETTY)} bytes):\n"
        '  {\n    "order_id": 3001,\n    "reject": "no_such_order"\n  }\n'
    ) in shown, shown
    assert "\\x0a" not in shown
    stamp = re.search(
        r"^  x-dead-lettered-at: (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)$", shown, re.MULTILINE
    )
    assert stamp is not None, shown
    at = datetime.datetime.fromisoformat(stamp[1])
    now = datetime.datetime.now(datetime.UTC)
    assert sent - datetime.timedelta(seconds=1) <= at <= now, (sent, at, now)


async def test_show_escapes_what_a_terminal_would_act_on_in_a_json_body(
    dead_letters: tuple[str, datetime.datetime], schema: str
) -> None:
    queue, _ = dead_letters
    raw = show(queue, "hostile-json", schema)
    assert not [c for c in ACTED_ON if c in raw], raw
    shown = raw.decode()
    assert '"note": "\\u001b[2J\\r\\u202e\\u0000"' in shown, shown
    # Still JSON, and the same value: what was printed reads back to what was received.
    assert json.loads(body_of(shown)) == json.loads(HOSTILE_JSON)


async def test_show_escapes_what_a_terminal_would_act_on_in_a_body_that_is_not_json(
    dead_letters: tuple[str, datetime.datetime], schema: str
) -> None:
    queue, _ = dead_letters
    raw = show(queue, "hostile-raw", schema)
    assert not [c for c in ACTED_ON if c in raw], raw
    shown = raw.decode()
    assert "  \\x1b[2J\\x0d\\u202e\\x00 not json\n  second line\n" in shown, shown
