"""The sample app the process tests run: one INSERT per message.

The `effects` table has no unique constraint on purpose: a doubled effect
shows up as two rows instead of being hidden by an error. The queue name and
the crash behaviour come from the environment the test gives the process.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from consumers import App, Context, Reject, RetryPolicy
from proving.faults import SigkillAt

FAST_RETRY = RetryPolicy(max_attempts=3, base_seconds=0.2, tiers_seconds=(0.2, 0.5, 1.0))

app = App(retry=FAST_RETRY, faults=SigkillAt.from_env(os.environ))


@app.handler(os.environ.get("TEST_QUEUE", "effects"))
async def record(ctx: Context) -> None:
    await ctx.tx.execute(
        "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
        " VALUES ($1, $2, $3, $4, $5)",
        ctx.consumer,
        ctx.tenant,
        ctx.message_id,
        str(ctx.body.get("n", "")),
        os.getpid(),
    )
    reject = ctx.body.get("reject")
    if isinstance(reject, str):
        raise Reject(reason=reject)
    held_back = ctx.body.get("reject_while")  # a file: rejected while it exists
    if isinstance(held_back, str) and Path(held_back).exists():  # noqa: ASYNC240 - a tiny test file
        raise Reject(reason="held_back")
    hold = ctx.body.get("hold_s")
    marker = os.environ.get("TEST_HOLD_MARKER")
    if isinstance(hold, int | float) and marker:
        # Tell the test the transaction is open, then hold it until SIGKILLed.
        Path(marker).write_text(str(os.getpid()))  # noqa: ASYNC240 - a tiny test file
        await asyncio.sleep(hold)
    block = ctx.body.get("block_s")
    block_marker = os.environ.get("TEST_BLOCK_MARKER")
    if isinstance(block, int | float) and block_marker:
        # Tell the test the handler runs, then block the whole event loop.
        Path(block_marker).write_text(str(os.getpid()))  # noqa: ASYNC240 - a tiny test file
        time.sleep(block)  # noqa: ASYNC251 - the blocking handler the watchdog is for
