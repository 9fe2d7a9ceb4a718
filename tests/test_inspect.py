"""`idempotent-workers inspect`: a key's claim, ledger rows, outbox rows and dead letters."""

from __future__ import annotations

import aio_pika

from consumers import AmqpSettings, Publisher, RetryPolicy, dead_letter_queue
from consumers.broker.topology import declare
from dedupe import DbConnection, Outbox, fingerprint
from tests.conftest import AMQP_URL, Spawn
from tests.support import wait_declared, wait_for
from tests.test_deadletters import count, put_dead_letter, run_cli

TOKEN = "a1b2c3d4e5f6a7b8c9d0"


async def test_inspect_shows_claim_ledger_outbox_and_dead_letter_copies(
    db: DbConnection,
    schema: str,
    channel: aio_pika.abc.AbstractChannel,
    publisher: Publisher,
    queue_name: str,
    spawn: Spawn,
) -> None:
    worker = spawn()
    await wait_declared(AMQP_URL, queue_name)
    await publisher.publish(queue_name, {"n": 1}, message_id="job-1", tenant="acme")

    async def claimed() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM processed_messages") == 1)

    await wait_for(claimed, timeout=60)
    worker.terminate()
    await worker.expect_exit(0)
    await db.execute(
        "INSERT INTO send_ledger (consumer, tenant, message_id, target_index, channel, address,"
        " effect_id, collapse_id, status, sends, provider_message_id) VALUES"
        " ($1, 'acme', 'job-1', 0, 'ios', $2, gen_random_uuid(), 'c-1', 'sent', 1, 'apns-77')",
        queue_name,
        TOKEN,
    )
    async with db.transaction():
        await Outbox(schema).enqueue(
            db, queue=queue_name, body={"n": 1}, message_id="job-1", tenant="acme"
        )
    await put_dead_letter(channel, queue_name, "job-1", headers={"x-tenant": "acme"})
    await put_dead_letter(channel, queue_name, "job-1", headers={"x-tenant": "other"})

    env = {"DATABASE_SCHEMA": schema}
    done = run_cli("inspect", "--tenant", "acme", queue_name, "job-1", env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"fingerprint={fingerprint({'n': 1}).hex()}" in out
    assert "claim: processed_at=20" in out
    assert (
        "ledger: 1 row(s)" in out and "status=sent" in out and "provider_message_id=apns-77" in out
    )
    assert TOKEN not in out and "address=a1b2c3…" in out
    assert "outbox: 1 row(s)" in out and "attempts=0" in out
    assert "copies=1" in out and "reason=max_attempts_exceeded:handler_error" in out
    assert await count(channel, dead_letter_queue(queue_name)) == 2  # read, not taken


async def test_inspect_of_an_unknown_key_says_so_and_exits_1(
    db: DbConnection,
    schema: str,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
    retry_policy: RetryPolicy,
) -> None:
    await declare(channel, queue_name, retry_policy, AmqpSettings(urls=(AMQP_URL,)))
    done = run_cli("inspect", queue_name, "nobody", env={"DATABASE_SCHEMA": schema})
    assert done.returncode == 1, done.stderr
    assert "claim: none" in done.stdout and "ledger: 0 row(s)" in done.stdout
    assert "outbox: 0 row(s)" in done.stdout and "copies=0" in done.stdout
