"""When the framework cannot decide a batch: find the message that breaks it, decide it alone.

A handler's exception is decided per message inside the runners; a lost
database connection re-runs the batch in place. Anything else that escapes
`runner.run` is the framework failing on something it did not foresee, most
likely one message. Handing the whole batch back to the broker
(`nack(requeue=True)`) would loop forever on a classic queue and spend every
batchmate's delivery-limit on a quorum one. Instead:

1. split the batch in halves and run each on its own, in delivery order (a
   half's multiple-ack then covers only tags settled before it);
2. a message that fails alone gets a `framework_error` retry with the error:
   it goes to a delay tier, spending an attempt, so a passing cause lets it
   through later and a lasting one ends in the dead-letter queue as
   `max_attempts_exceeded:framework_error`;
3. if even that cannot be published, it is rejected without requeue and the
   broker dead-letters it (`x-death` reason `rejected`): never a loop.

Re-running a half is safe: nothing of a failed run was acked, and its claims
either rolled back or tell the re-run what committed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import structlog

from consumers.message.verdict import error_text, retry
from consumers.pipeline.deliveries import Delivery, Item
from consumers.pipeline.runner import Runner

log = structlog.get_logger(__name__)


async def run_isolating(
    runner: Runner, batch: Sequence[Delivery], started: Callable[[], None]
) -> None:
    """`runner.run(batch, started)`; on a framework failure, bisect and decide the culprit alone."""
    try:
        await runner.run(batch, started)
        return
    except Exception as exc:
        error = exc
    queue = runner.spec.queue
    if len(batch) == 1:
        await _undecidable(runner, batch[0], error)
        return
    log.warning("batch_isolating", consumer=queue, size=len(batch), error=error_text(error))
    middle = len(batch) // 2
    await run_isolating(runner, batch[:middle], started)
    await run_isolating(runner, batch[middle:], started)


async def _undecidable(runner: Runner, delivery: Delivery, error: Exception) -> None:
    log.error(
        "message_undecidable",
        consumer=runner.spec.queue,
        message_id=delivery.message_id,
        error=error_text(error),
        exc_info=error,
    )
    item = Item(delivery=delivery, envelope=None)
    try:
        await runner.dispatcher.settle(
            runner.spec,
            [(item, retry("framework_error", error=error_text(error)))],
            acks=runner.acks,
        )
    except Exception:
        log.exception(
            "message_rejected", consumer=runner.spec.queue, message_id=delivery.message_id
        )
        with contextlib.suppress(Exception):
            await delivery.nack(requeue=False)
        if runner.acks is not None:  # gone at the broker: no longer holds the window back
            await runner.acks.settle((), nacked=[item])
