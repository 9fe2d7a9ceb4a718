"""docs/send-api.md: a job relayed before any worker declared its queue waits, and says so.

The send API's jobs reach their queue through the relay, and queues are
declared by the worker that consumes them. The guide says what a reader sees
when the relay runs first: one `outbox_publish_failed` warning per try with
`unroutable: no queue named '<queue>'`, the job kept pending, and published
by the first try after a worker declared the queue.
"""

from __future__ import annotations

from consumers import App, Context, Relay
from dedupe import Outbox
from tests.harness import Harness


async def test_a_job_relayed_before_its_worker_started_waits_then_goes_once(
    harness: Harness,
) -> None:
    schema = harness.settings.database.schema
    async with harness.db.transaction():
        await Outbox(schema).enqueue(
            harness.db, queue=harness.queue, body={"n": 1}, message_id="ingress-1"
        )
    app = App(retry=harness.retry)

    @app.handler(harness.queue)
    async def record(ctx: Context) -> None:
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ($1, $2, $3, '', 0)",
            ctx.consumer,
            ctx.tenant,
            ctx.message_id,
        )

    relay = Relay(harness.settings)
    await relay.start()
    try:
        await harness.wait_outcome("outbox_publish_failed")
        failed = next(e for e in harness.logs if e["event"] == "outbox_publish_failed")
        assert failed["log_level"] == "warning"
        assert failed["error"] == (
            f"unroutable: no queue named '{harness.queue}': the broker returned job 'ingress-1'"
        )
        pending = await harness.db.fetchrow("SELECT attempts, published_at FROM outbox")
        assert pending is not None and pending["attempts"] >= 1
        assert pending["published_at"] is None
        async with harness.run(app):  # declares the queue
            await harness.wait_outcome("effect_committed")
    finally:
        await relay.stop()
    assert await harness.effects() == 1
    assert await harness.db.fetchval("SELECT published_at IS NOT NULL FROM outbox")
