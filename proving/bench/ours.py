"""Our worker, in the bench process, with the default settings and logging on.

- `framework`: a per-message handler writing its one INSERT with `ctx.stage()`
  (the documented way: one `executemany` per batch, no round trip per message);
- `framework_execute`: the same handler awaiting `ctx.tx.execute()` itself,
  one round trip per message inside the batch's transaction;
- `framework_batch`: a batch handler writing a batch's effects in one statement;
- `framework_quiet`: `framework` without the line per committed effect, to
  price logging.

Each gets the worker as `idempotent-workers run` builds it: prefetch 1000,
batches of up to 500 flushed as soon as the previous commit returns, one log
line per outcome as JSON (to the bench's log file, as production sends it to
a file or a collector).
"""

from __future__ import annotations

from consumers import App, Batch, Context, Worker
from consumers.runtime.collector import freeze_started
from proving.bench.sandbox import INSERT_EFFECT, INSERT_EFFECTS
from proving.bench.variant import Run, Variant
from proving.deadlines import ANSWER_S


def _staging_app(queue: str) -> App:
    app = App()

    @app.handler(queue)
    async def record(ctx: Context) -> None:
        body = ctx.body
        await ctx.stage(
            INSERT_EFFECT,
            ctx.consumer,
            ctx.tenant,
            ctx.message_id,
            body["order_id"],
            body["total_cents"],
        )

    return app


def _executing_app(queue: str) -> App:
    app = App()

    @app.handler(queue)
    async def record(ctx: Context) -> None:
        body = ctx.body
        await ctx.tx.execute(
            INSERT_EFFECT,
            ctx.consumer,
            ctx.tenant,
            ctx.message_id,
            body["order_id"],
            body["total_cents"],
        )

    return app


def _batch_app(queue: str) -> App:
    app = App()

    @app.batch_handler(queue)
    async def record(batch: Batch) -> None:
        messages = batch.messages
        await batch.tx.execute(
            INSERT_EFFECTS,
            [m.consumer for m in messages],
            [m.tenant for m in messages],
            [m.message_id for m in messages],
            [m.body["order_id"] for m in messages],
            [m.body["total_cents"] for m in messages],
            timeout=ANSWER_S,
        )

    return app


async def _work(run: Run, app: App, *, log_effects: bool = True) -> None:
    worker = Worker(app, run.settings, log_effects=log_effects)
    await worker.start()
    freeze_started()  # as `idempotent-workers run` does once its worker started
    try:
        await run.finished()
    finally:
        await worker.stop()


async def framework(run: Run) -> None:
    await _work(run, _staging_app(run.sandbox.queue))


async def framework_execute(run: Run) -> None:
    await _work(run, _executing_app(run.sandbox.queue))


async def framework_batch(run: Run) -> None:
    await _work(run, _batch_app(run.sandbox.queue))


async def framework_quiet(run: Run) -> None:
    await _work(run, _staging_app(run.sandbox.queue), log_effects=False)


VARIANTS = (
    Variant(
        name="framework",
        what="our worker, per-message handler, its INSERT via ctx.stage()",
        consume=framework,
    ),
    Variant(
        name="framework_batch",
        what="our worker, @app.batch_handler, a batch's effects in one statement",
        consume=framework_batch,
    ),
    Variant(
        name="framework_execute",
        what="our worker, per-message handler awaiting ctx.tx.execute() (a round trip each)",
        consume=framework_execute,
    ),
    Variant(
        name="framework_quiet",
        what="framework without the log line per committed effect (prices logging)",
        consume=framework_quiet,
    ),
)
