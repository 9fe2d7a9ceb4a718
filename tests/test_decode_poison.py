"""A message the framework chokes on outside the handler harms only itself.

Each poison message is published raw (bytes aio-pika would refuse to send)
between good ones, before the worker starts, so they share its first batch.
The promise: the poison is dead-lettered at once with a reason, and every
good batchmate commits once, its handler run once (no extra delivery).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aio_pika
import pytest

from consumers import REASON_HEADER, App, Context, RetryPolicy, Settings, Worker
from consumers.broker.headers import DROPPED_HEADERS
from dedupe import DbConnection
from proving.rawamqp import RawProperties, RawPublisher
from tests.conftest import AMQP_URL
from tests.support import drain_dead_letters, wait_for

GOOD_BEFORE = 5
GOOD_AFTER = 5
DEEP = 3_000  # nesting levels: past orjson's limit and Python's recursion limit


@dataclass(frozen=True, slots=True, kw_only=True)
class Poison:
    name: str
    properties: RawProperties
    body: bytes = b'{"n": -1}'
    reason: str  # the x-reason of its dead letter


POISON = [
    Poison(
        name="json_nested_too_deep",
        properties=RawProperties(message_id="deep"),
        body=b'{"a": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        reason="json_too_deep",
    ),
    Poison(
        name="nul_in_message_id",
        properties=RawProperties(message_id="order-\x00-1"),
        reason="message_id_has_nul",
    ),
    Poison(
        name="nul_in_tenant",
        properties=RawProperties(message_id="nul-tenant", headers={"x-tenant": "acme\x00"}),
        reason="tenant_has_nul",
    ),
    Poison(
        name="message_id_not_utf8",
        properties=RawProperties(message_id=b"order-\xff"),
        reason="message_id_not_utf8",
    ),
    Poison(
        name="tenant_not_utf8",
        properties=RawProperties(message_id="bad-tenant", headers={"x-tenant": b"\xfe"}),
        reason="tenant_not_utf8",
    ),
    Poison(
        name="header_value_not_utf8",
        properties=RawProperties(message_id="bad-header", headers={"x-trace": b"\xff\xfe"}),
        body=b"{not json",
        reason="invalid_json",
    ),
    Poison(
        name="header_key_not_utf8",
        properties=RawProperties(message_id="bad-key", headers={b"x-\xff": "v"}),
        body=b"{not json",
        reason="invalid_json",
    ),
    Poison(
        name="content_encoding_gzip",
        properties=RawProperties(message_id="zipped", content_encoding="gzip"),
        reason="unsupported_content_encoding",
    ),
    Poison(
        name="content_type_json_prefix",
        properties=RawProperties(message_id="jsonx", content_type="application/jsonx"),
        reason="unsupported_content_type",
    ),
]


def counting_app(queue: str, retry: RetryPolicy, calls: dict[str, int]) -> App:
    app = App(retry=retry)

    @app.handler(queue)
    async def record(ctx: Context) -> None:
        calls[ctx.message_id] = calls.get(ctx.message_id, 0) + 1
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ($1, $2, $3, $4, 0)",
            ctx.consumer,
            ctx.tenant,
            ctx.message_id,
            str(ctx.body.get("n", "")),
        )

    return app


async def publish_between_good(queue: str, poison: Sequence[tuple[RawProperties, bytes]]) -> None:
    async with await RawPublisher.connect_url(AMQP_URL) as raw:
        for n in range(GOOD_BEFORE):
            raw.send(queue, b'{"n": %d}' % n, RawProperties(message_id=f"good-{n}"))
        for properties, body in poison:
            raw.send(queue, body, properties)
        for n in range(GOOD_BEFORE, GOOD_BEFORE + GOOD_AFTER):
            raw.send(queue, b'{"n": %d}' % n, RawProperties(message_id=f"good-{n}"))
        await raw.confirm()


async def effect_ids(db: DbConnection) -> list[str]:
    return sorted(r["message_id"] for r in await db.fetch("SELECT message_id FROM effects"))


async def dead_letter_count(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(f"{queue}.dlq", passive=True)
    return declared.declaration_result.message_count or 0


GOOD = sorted(f"good-{n}" for n in range(GOOD_BEFORE + GOOD_AFTER))


@pytest.mark.parametrize("poison", POISON, ids=[p.name for p in POISON])
async def test_poison_outside_the_handler_is_dead_lettered_alone_and_its_batchmates_commit_once(
    poison: Poison,
    db: DbConnection,
    queue_name: str,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    calls: dict[str, int] = {}
    app = counting_app(queue_name, retry_policy, calls)
    async with Worker(app, settings):
        pass  # declares the queues
    await publish_between_good(queue_name, [(poison.properties, poison.body)])
    async with Worker(app, settings):
        await wait_for(lambda: _all_effected(db), timeout=30)
        await wait_for(lambda: _dead_lettered(channel, queue_name), timeout=30)
    dead = await drain_dead_letters(channel, queue_name)
    assert [d.headers[REASON_HEADER] for d in dead] == [poison.reason]
    assert dead[0].body == poison.body
    assert await effect_ids(db) == GOOD
    assert calls == dict.fromkeys(GOOD, 1)  # each good one ran once: no extra delivery


async def test_header_that_cannot_be_written_back_is_kept_raw_in_the_dead_letter(
    db: DbConnection,
    queue_name: str,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    app = counting_app(queue_name, retry_policy, {})
    async with Worker(app, settings):
        properties = RawProperties(
            message_id="raw-headers",
            headers={"x-trace": b"\xff\xfe", b"x-\xff": "v", "x-ok": "fine"},
        )
        await publish_between_good(queue_name, [(properties, b"{not json")])
        await wait_for(lambda: _dead_lettered(channel, queue_name), timeout=30)
    (dead,) = await drain_dead_letters(channel, queue_name)
    assert dead.message_id == "raw-headers"
    assert dead.headers["x-trace"] == bytearray(b"\xff\xfe")  # byte for byte
    assert dead.headers["x-ok"] == "fine"
    assert dead.headers[DROPPED_HEADERS] == ascii(b"x-\xff")


async def test_message_id_not_utf8_is_dead_lettered_with_its_bytes_and_no_invented_key(
    db: DbConnection,
    queue_name: str,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    app = counting_app(queue_name, retry_policy, {})
    async with Worker(app, settings):
        properties = RawProperties(message_id=b"order-\xff")
        await publish_between_good(queue_name, [(properties, b'{"n": 1}')])
        await wait_for(lambda: _dead_lettered(channel, queue_name), timeout=30)
    (dead,) = await drain_dead_letters(channel, queue_name)
    assert dead.headers[REASON_HEADER] == "message_id_not_utf8"
    assert dead.headers["x-no-message-id"] is True
    assert dead.headers["x-raw-message_id"] == bytearray(b"order-\xff")


async def test_tenants_that_are_not_utf8_are_rejected_never_replaced_into_one_key(
    db: DbConnection,
    queue_name: str,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    app = counting_app(queue_name, retry_policy, {})
    tenants: list[bytes | str] = [b"\xff", b"\xfe", "\ufffd"]
    async with Worker(app, settings):
        poison = [
            (RawProperties(message_id="welcome-1", headers={"x-tenant": t}), b'{"n": 1}')
            for t in tenants
        ]
        await publish_between_good(queue_name, poison)
        await wait_for(lambda: _all_effected(db, extra=1), timeout=30)
        await wait_for(lambda: _dead_lettered(channel, queue_name, 2), timeout=30)
    dead = await drain_dead_letters(channel, queue_name)
    raw_tenants = [d.headers["x-tenant"] for d in dead]
    assert sorted(bytes(t) for t in raw_tenants if isinstance(t, bytearray)) == [b"\xfe", b"\xff"]
    assert {d.headers[REASON_HEADER] for d in dead} == {"tenant_not_utf8"}
    rows = await db.fetch("SELECT tenant FROM effects WHERE message_id = 'welcome-1'")
    assert [r["tenant"] for r in rows] == ["\ufffd"]


async def test_content_type_is_matched_case_insensitively_as_a_media_type(
    db: DbConnection,
    queue_name: str,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    app = counting_app(queue_name, retry_policy, {})
    async with Worker(app, settings):
        poison = [
            (RawProperties(message_id="mixed-case", content_type=ct), b'{"n": 1}')
            for ct in ("Application/JSON; charset=utf-8", " application/json ;Charset=UTF8")
        ]
        await publish_between_good(queue_name, poison)
        await wait_for(lambda: _all_effected(db, extra=1), timeout=30)
    assert await dead_letter_count(channel, queue_name) == 0
    assert "mixed-case" in await effect_ids(db)


async def _all_effected(db: DbConnection, *, extra: int = 0) -> bool:
    count: int = await db.fetchval("SELECT count(*) FROM effects")
    return count >= len(GOOD) + extra


async def _dead_lettered(channel: aio_pika.abc.AbstractChannel, queue: str, n: int = 1) -> bool:
    return await dead_letter_count(channel, queue) >= n
