"""Settle a decided batch: publish retries and dead letters, log, then ack.

Runs only after the batch's transaction committed. Retries and dead letters
are published with confirms *before* the original is acked, so a crash in
between leaves a redelivery (harmless: the claim or a second dead letter),
never a lost message. Acks go out with `multiple=True` per channel: a batch
holds every outstanding delivery up to its highest tag, because one batch
loop owns one channel and settles a batch before taking the next.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aio_pika
import structlog

from consumers.envelope import ATTEMPT_HEADER, NO_MESSAGE_ID_HEADER, REASON_HEADER, attempt_of
from consumers.logs import OutcomeLines, outcome_lines
from consumers.metrics import ConsumerMetrics, Metrics
from consumers.retry import dead_letter_queue, tier_queue
from consumers.verdict import Outcome
from consumers.wire import republishable_headers, republished

if TYPE_CHECKING:
    from consumers.items import Item
    from consumers.spec import HandlerSpec

log = structlog.get_logger(__name__)

PUBLISH_TRIES = 5  # over about 7 s, long enough for a robust channel to come back
ERROR_HEADER = "x-error"
QUEUE_HEADER = (
    "x-original-queue"  # informative: a replay never routes by it (a publisher can forge it)
)
# When the message was first dead-lettered (epoch ms), kept through replays:
# `dlq replay` refuses one older than retention, whose claim may be deleted.
DEAD_LETTERED_AT_HEADER = "x-dead-lettered-at"


class Dispatcher:
    """Publishes on one confirm channel shared by the worker's batch loops."""

    def __init__(
        self,
        channel: aio_pika.abc.AbstractChannel,
        *,
        log_effects: bool = True,
        metrics: Metrics | None = None,
    ) -> None:
        self._exchange = channel.default_exchange
        self.log_effects = log_effects
        self._metrics = metrics if metrics is not None else Metrics()

    async def settle(self, spec: HandlerSpec, items: Sequence[Item]) -> None:
        movers = [item for item in items if _needs_move(item)]
        results = (
            await asyncio.gather(*(self._move(spec, i) for i in movers), return_exceptions=True)
            if movers
            else []
        )
        unsettled = {
            id(item)
            for item, result in zip(movers, results, strict=True)
            if isinstance(result, BaseException)
        }
        now = time.monotonic()
        lines = outcome_lines()
        tally: dict[tuple[Outcome, str], int] = {}
        for item in items:
            if id(item) in unsettled:
                continue
            key = self._log_outcome(spec, item, now, lines)
            tally[key] = tally.get(key, 0) + 1
        if lines is not None:
            lines.flush()
        metrics = self._metrics.consumer(spec.queue)
        metrics.settled(tally)
        await _acknowledge(items, unsettled, metrics)

    async def _move(self, spec: HandlerSpec, item: Item) -> None:
        """Republish `item` to a delay tier or the dead-letter queue, confirmed."""
        verdict = item.verdict
        assert verdict is not None
        delivery = item.delivery
        attempt = attempt_of(delivery)
        headers = republishable_headers(delivery.headers or {})
        headers.pop("x-death", None)  # grows with every tier pass; the attempt header counts
        if verdict.error:
            headers[ERROR_HEADER] = verdict.error
        if not delivery.message_id:
            headers[NO_MESSAGE_ID_HEADER] = True
        retrying = verdict.outcome is Outcome.RETRY_SCHEDULED
        if retrying and (not verdict.spend_attempt or not spec.retry.exhausted(attempt)):
            wanted = verdict.delay if verdict.delay is not None else spec.retry.backoff(attempt)
            tier = spec.retry.tier_for(wanted)
            headers[ATTEMPT_HEADER] = attempt + 1 if verdict.spend_attempt else attempt
            headers[REASON_HEADER] = verdict.reason
            routing_key = tier_queue(spec.queue, tier)
            item.tier = tier
        else:
            if verdict.outcome is Outcome.RETRY_SCHEDULED:
                item.exhausted = True
            headers[ATTEMPT_HEADER] = attempt
            headers[REASON_HEADER] = (
                f"max_attempts_exceeded:{verdict.reason}" if item.exhausted else verdict.reason
            )
            headers[QUEUE_HEADER] = spec.queue
            stamp_dead_lettered(headers)
            routing_key = dead_letter_queue(spec.queue)
        message = republished(delivery, headers)
        for attempt in range(1, PUBLISH_TRIES + 1):
            try:
                await self._exchange.publish(message, routing_key=routing_key)
                return
            except Exception as exc:
                # Mostly the confirm channel reconnecting after a broker restart:
                # wait for it rather than handing the message back to the queue,
                # where every return counts toward the delivery-limit.
                if attempt == PUBLISH_TRIES:
                    log.error(
                        "republish_failed",
                        consumer=spec.queue,
                        message_id=delivery.message_id,
                        routing_key=routing_key,
                        error=repr(exc),
                    )
                    raise
                await asyncio.sleep(0.25 * 2**attempt)

    def _log_outcome(
        self, spec: HandlerSpec, item: Item, now: float, lines: OutcomeLines | None
    ) -> tuple[Outcome, str]:
        """Log the item's outcome line; return (outcome, reason) for the metrics."""
        verdict = item.verdict
        assert verdict is not None
        envelope = item.envelope
        outcome = verdict.outcome
        if outcome is Outcome.RETRY_SCHEDULED and item.exhausted:
            outcome = Outcome.DEAD_LETTERED
            reason = f"max_attempts_exceeded:{verdict.reason}"
        else:
            reason = verdict.reason if outcome is not Outcome.MESSAGE_ID_REUSED else ""
        if outcome is Outcome.EFFECT_COMMITTED and not self.log_effects:
            return outcome, reason
        fields: dict[str, Any] = {
            "consumer": spec.queue,
            "tenant": envelope.tenant if envelope else "",
            "message_id": item.delivery.message_id,
            "attempt": attempt_of(item.delivery),
            "duration_ms": round((now - item.started) * 1000, 2),
        }
        if verdict.reason:
            fields["reason"] = verdict.reason
        if verdict.error:
            fields["error"] = verdict.error
        if item.tier is not None:
            fields["delay_s"] = item.tier
        level = (
            "info"
            if outcome in (Outcome.EFFECT_COMMITTED, Outcome.DUPLICATE_IGNORED)
            else "warning"
        )
        if lines is not None:
            lines.line(str(outcome), level, fields)
        elif level == "info":
            log.info(str(outcome), **fields)
        else:
            log.warning(str(outcome), **fields)
        return outcome, reason


def stamp_dead_lettered(headers: dict[str, Any], now: float | None = None) -> None:
    """Set `x-dead-lettered-at` to the earliest of what it holds and now."""
    now_ms = int((time.time() if now is None else now) * 1000)
    held = headers.get(DEAD_LETTERED_AT_HEADER)
    if isinstance(held, int) and not isinstance(held, bool) and 0 < held < now_ms:
        now_ms = held
    headers[DEAD_LETTERED_AT_HEADER] = now_ms


def _needs_move(item: Item) -> bool:
    assert item.verdict is not None
    return item.verdict.outcome in (
        Outcome.RETRY_SCHEDULED,
        Outcome.DEAD_LETTERED,
        Outcome.MESSAGE_ID_REUSED,
    )


async def _acknowledge(
    items: Sequence[Item], unsettled: set[int], metrics: ConsumerMetrics
) -> None:
    """Ack settled items (multiple=True per channel); leave the rest to redelivery."""
    highest: dict[int, Item] = {}
    covered: dict[int, int] = {}  # deliveries each channel's one ack settles
    failed = 0
    for item in items:
        if id(item) in unsettled:
            # Could not be republished: give it back to the broker now rather
            # than acking it past (a multiple ack would cover it otherwise).
            await _quietly(item.delivery.nack(requeue=True), item)
            continue
        try:
            key = id(item.delivery.channel)
        except aio_pika.exceptions.ChannelInvalidStateError as exc:
            # Delivered on a channel that has closed since (a reconnect): an
            # ack cannot reach the broker, which redelivers the message.
            log.warning(
                "ack_failed",
                message_id=item.delivery.message_id,
                error=repr(exc),
                outcome="left_to_redelivery",
            )
            failed += 1
            continue
        covered[key] = covered.get(key, 0) + 1
        tag = item.delivery.delivery_tag or 0
        best = highest.get(key)
        if best is None or tag > (best.delivery.delivery_tag or 0):
            highest[key] = item
    for key, item in highest.items():
        if not await _quietly(item.delivery.ack(multiple=True), item):
            failed += covered[key]
    if failed:
        metrics.acks_failed(failed)


async def _quietly(action: Any, item: Item) -> bool:
    """Await an ack or nack; False (and a log line) if it could not go out."""
    try:
        await action
    except Exception as exc:  # a channel closed since delivery: the broker redelivers
        log.warning(
            "ack_failed",
            message_id=item.delivery.message_id,
            error=repr(exc),
            outcome="left_to_redelivery",
        )
        return False
    return True
