"""The delivery loop in one process: duplicates, reuse, bad input, retries, batches."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import aio_pika
import pytest

from consumers import ATTEMPT_HEADER, REASON_HEADER, App, Batch, Context, Reject, Retry, RetryPolicy
from tests.conftest import AMQP_URL
from tests.harness import Harness
from tests.rawamqp import publish_raw


def effects_app(queue: str, retry: RetryPolicy) -> App:
    app = App(retry=retry)

    @app.handler(queue)
    async def record(ctx: Context) -> None:
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ($1, $2, $3, $4, 0)",
            ctx.consumer,
            ctx.tenant,
            ctx.message_id,
            str(ctx.body.get("n", "")),
        )

    return app


async def test_same_message_published_twice_applies_effect_once(harness: Harness) -> None:
    async with harness.run(effects_app(harness.queue, harness.retry)):
        await harness.publish({"n": 1}, message_id="order-1-shipped")
        await harness.publish({"n": 1}, message_id="order-1-shipped")
        await harness.wait_outcome("duplicate_ignored")
    assert await harness.effects() == 1


async def test_duplicate_arriving_after_commit_is_acked_without_effect(harness: Harness) -> None:
    async with harness.run(effects_app(harness.queue, harness.retry)):
        await harness.publish({"b": 1, "a": [1, 2]}, message_id="m")
        await harness.wait_processed(1)
        # Equivalent JSON, formatted otherwise: the same fingerprint.
        await harness.publish(b'{ "a": [1, 2], "b": 1 }', message_id="m")
        await harness.wait_outcome("duplicate_ignored")
    assert await harness.effects() == 1
    assert await harness.dead_letters() == []


async def test_same_message_id_in_two_tenants_applies_both(harness: Harness) -> None:
    async with harness.run(effects_app(harness.queue, harness.retry)):
        await harness.publish({"n": 1}, message_id="welcome-1", tenant="acme")
        await harness.publish({"n": 2}, message_id="welcome-1", tenant="globex")
        await harness.wait_processed(2)
    rows = await harness.db.fetch("SELECT tenant FROM effects ORDER BY tenant")
    assert [r["tenant"] for r in rows] == ["acme", "globex"]


async def test_reused_message_id_with_another_body_is_dead_lettered_without_effect(
    harness: Harness,
) -> None:
    async with harness.run(effects_app(harness.queue, harness.retry)):
        await harness.publish({"n": 1}, message_id="welcome-1")
        await harness.wait_processed(1)
        await harness.publish({"n": 2}, message_id="welcome-1")
        await harness.wait_dead_letters(1)
    dead = await harness.dead_letters()
    assert [d.message_id for d in dead] == ["welcome-1"]
    assert dead[0].headers[REASON_HEADER] == "message_id_reused"
    assert await harness.db.fetchval("SELECT body FROM effects") == "1"
    assert await harness.effects() == 1


async def test_reuse_within_one_batch_is_dead_lettered_without_effect(harness: Harness) -> None:
    # Published before the worker starts, so both land in its first batch.
    app = effects_app(harness.queue, harness.retry)
    async with harness.run(app):
        pass  # declares the queues
    await harness.publish({"n": 1}, message_id="k")
    await harness.publish({"n": 2}, message_id="k")
    await harness.publish({"n": 1}, message_id="k")
    async with harness.run(app):
        await harness.wait_dead_letters(1)
        await harness.wait_outcome("duplicate_ignored")
    assert await harness.effects() == 1
    assert await harness.db.fetchval("SELECT body FROM effects") == "1"


BAD_INPUTS = [
    ("invalid_json", aio_pika.Message(b"{not json", message_id="bad-1")),
    ("body_not_json_object", aio_pika.Message(b"[1, 2]", message_id="bad-2")),
    ("message_id_too_long", aio_pika.Message(b'{"n": 1}', message_id="x" * 129)),
    ("body_too_large", aio_pika.Message(b'{"n": "' + b"x" * 5000 + b'"}', message_id="bad-5")),
    (
        "unsupported_content_type",
        aio_pika.Message(b"<n/>", message_id="bad-6", content_type="text/xml"),
    ),
    ("invalid_json", aio_pika.Message(b'{"n": NaN}', message_id="bad-7")),
    ("invalid_json", aio_pika.Message(b'{"n": "\xff"}', message_id="bad-8")),
]


@pytest.mark.parametrize(
    ("reason", "message"), BAD_INPUTS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BAD_INPUTS)]
)
async def test_bad_input_is_dead_lettered_with_reason_and_the_worker_keeps_consuming(
    reason: str, message: aio_pika.Message, harness: Harness
) -> None:
    small = replace(harness.settings, worker=replace(harness.settings.worker, max_body_bytes=4096))
    async with harness.run(effects_app(harness.queue, harness.retry), small):
        await harness.publish_message(message)
        await harness.publish({"n": 2}, message_id="good-after-bad")
        await harness.wait_processed(1)
        await harness.wait_dead_letters(1)
    dead = await harness.dead_letters()
    assert len(dead) == 1
    assert dead[0].headers[REASON_HEADER] == reason
    assert dead[0].body == message.body
    assert await harness.db.fetchval("SELECT message_id FROM effects") == "good-after-bad"


async def test_message_without_message_id_is_dead_lettered(harness: Harness) -> None:
    async with harness.run(effects_app(harness.queue, harness.retry)):
        await publish_raw(harness.queue, b'{"n": 1}', url=AMQP_URL)
        await harness.publish({"n": 2}, message_id="good-after-bad")
        await harness.wait_dead_letters(1)
        await harness.wait_processed(1)
    dead = await harness.dead_letters()
    assert dead[0].headers["x-no-message-id"] is True
    assert dead[0].headers[REASON_HEADER] == "missing_message_id"
    assert await harness.effects() == 1


async def test_handler_that_always_raises_is_dead_lettered_after_max_attempts_with_backoff(
    harness: Harness,
) -> None:
    policy = RetryPolicy(max_attempts=3, base_seconds=0.3, tiers_seconds=(0.3, 0.6, 1.2))
    seen: list[tuple[int, float]] = []
    app = App(retry=policy)

    @app.handler(harness.queue)
    async def always_fails(ctx: Context) -> None:
        seen.append((ctx.attempt, time.monotonic()))
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, 'rolled back', 0)",
            ctx.message_id,
        )
        raise RuntimeError("the downstream is broken")

    async with harness.run(app):
        await harness.publish({"n": 1}, message_id="doomed")
        await harness.wait_dead_letters(1, timeout=20)
    attempts = [a for a, _ in seen]
    assert attempts == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(seen)]
    assert all(gap >= 0.3 for gap in gaps), gaps  # a delay tier sat between attempts
    dead = await harness.dead_letters()
    assert dead[0].headers[REASON_HEADER] == "max_attempts_exceeded:handler_error"
    assert dead[0].headers[ATTEMPT_HEADER] == 3
    assert "the downstream is broken" in str(dead[0].headers["x-error"])
    assert await harness.effects() == 0
    assert await harness.db.fetchval("SELECT count(*) FROM processed_messages") == 0


async def test_one_failing_handler_in_a_batch_leaves_the_others_committed_once(
    harness: Harness,
) -> None:
    calls: dict[str, int] = {}
    app = App(retry=harness.retry)

    @app.handler(harness.queue)
    async def flaky(ctx: Context) -> None:
        calls[ctx.message_id] = calls.get(ctx.message_id, 0) + 1
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, $2, 0)",
            ctx.message_id,
            str(ctx.attempt),
        )
        if ctx.message_id == "m-3" and ctx.attempt == 1:
            raise Retry(delay=0.2, reason="not_yet")

    async with harness.run(app):
        pass  # declare
    for n in range(6):
        await harness.publish({"n": n}, message_id=f"m-{n}")
    async with harness.run(app):  # all six arrive in one batch
        await harness.wait_processed(6, timeout=15)  # claims commit with their effects
    rows = await harness.db.fetch("SELECT message_id, body FROM effects ORDER BY message_id")
    assert [(r["message_id"], r["body"]) for r in rows] == [
        ("m-0", "1"),
        ("m-1", "1"),
        ("m-2", "1"),
        ("m-3", "2"),
        ("m-4", "1"),
        ("m-5", "1"),
    ]
    assert calls["m-3"] == 3  # fast path, careful re-run, then the retry
    assert await harness.dead_letters() == []


async def test_reject_dead_letters_at_once_with_the_handlers_reason(harness: Harness) -> None:
    app = App(retry=harness.retry)

    @app.handler(harness.queue)
    async def picky(ctx: Context) -> None:
        if ctx.body.get("sku") is None:
            raise Reject(reason="missing_sku")

    async with harness.run(app):
        await harness.publish({"n": 1}, message_id="no-sku")
        await harness.wait_dead_letters(1)
    dead = await harness.dead_letters()
    assert dead[0].headers[REASON_HEADER] == "missing_sku"
    assert dead[0].headers[ATTEMPT_HEADER] == 1


async def test_error_outside_retry_on_is_dead_lettered_without_retry(harness: Harness) -> None:
    policy = RetryPolicy(max_attempts=5, tiers_seconds=(0.2,), retry_on=(TimeoutError,))
    app = App(retry=policy)
    seen: list[int] = []

    @app.handler(harness.queue)
    async def buggy(ctx: Context) -> None:
        seen.append(ctx.attempt)
        raise KeyError("bug")

    async with harness.run(app):
        await harness.publish({"n": 1}, message_id="bug")
        await harness.wait_dead_letters(1)
    assert seen == [1]  # one run, no retry
    dead = await harness.dead_letters()
    assert dead[0].headers[REASON_HEADER] == "handler_error"


async def test_failing_batch_handler_is_split_and_the_others_commit_once(harness: Harness) -> None:
    app = App(retry=harness.retry)

    @app.batch_handler(harness.queue)
    async def record_all(batch: Batch) -> None:
        await batch.tx.executemany(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, $2, 0)",
            [(m.message_id, str(m.body["n"])) for m in batch.messages],
        )
        if any(m.body["n"] == 5 for m in batch.messages):
            raise Reject(reason="five_is_poison")

    async with harness.run(app):
        pass
    for n in range(10):
        await harness.publish({"n": n}, message_id=f"b-{n}")
    async with harness.run(app):
        await harness.wait_processed(9, timeout=15)
        await harness.wait_dead_letters(1)
    bodies = sorted(int(r["body"]) for r in await harness.db.fetch("SELECT body FROM effects"))
    assert bodies == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    dead = await harness.dead_letters()
    assert [d.message_id for d in dead] == ["b-5"]


async def test_staged_effects_commit_once_with_one_statement_per_batch(harness: Harness) -> None:
    app = App(retry=harness.retry)

    @app.handler(harness.queue)
    async def staged(ctx: Context) -> None:
        await ctx.stage(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, $2, 0)",
            ctx.message_id,
            str(ctx.body["n"]),
        )
        if ctx.body["n"] == 3 and ctx.attempt == 1:
            raise Retry(delay=0.2)

    async with harness.run(app):
        for n in range(20):
            await harness.publish({"n": n}, message_id=f"s-{n}")
            await harness.publish({"n": n}, message_id=f"s-{n}")
        await harness.wait_processed(20, timeout=15)
        await harness.wait_outcome("duplicate_ignored", 20)  # every second copy, acked
    rows = await harness.db.fetch(
        "SELECT message_id, count(*) AS c FROM effects GROUP BY message_id"
    )
    assert len(rows) == 20
    assert all(r["c"] == 1 for r in rows)
