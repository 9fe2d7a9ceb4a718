"""Settle a decided batch: publish retries and dead letters, log, then ack.

Runs only after the batch's transaction committed. Retries and dead letters
are published with confirms *before* the original is acked, so a crash in
between leaves a redelivery (harmless: the claim or a second dead letter),
never a lost message. Acks go out with `multiple=True` per channel: a batch
holds every outstanding delivery up to its highest tag, because one batch
loop owns one channel and settles a batch before taking the next. The push
runner settles jobs one by one while other batches of its channel are in
flight: its acks go through its `AckWindow` (`consumers.pipeline.acks`), which acks
`multiple=True` only up to the lowest delivery still in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aio_pika
import structlog

from consumers.broker.headers import republishable_headers, republished
from consumers.handlers.retry import dead_letter_queue, tier_queue
from consumers.message.envelope import (
    ATTEMPT_HEADER,
    NO_MESSAGE_ID_HEADER,
    REASON_HEADER,
    attempt_of,
)
from consumers.message.verdict import Outcome, Verdict
from consumers.pipeline.acks import AckWindow, quietly
from consumers.pipeline.traced import close_message
from consumers.telemetry.logs import OutcomeLines, outcome_lines
from consumers.telemetry.metrics import ConsumerMetrics, Metrics
from consumers.telemetry.tracing import tracing

if TYPE_CHECKING:
    from consumers.handlers.spec import HandlerSpec
    from consumers.pipeline.deliveries import Item

log = structlog.get_logger(__name__)

PUBLISH_TRIES = 5  # over about 7 s, long enough for a robust channel to come back
ERROR_HEADER = "x-error"
QUEUE_HEADER = (
    "x-original-queue"  # informative: a replay never routes by it (a publisher can forge it)
)
# When the message was first dead-lettered (epoch ms), kept through replays:
# `dlq replay` refuses one older than retention, whose claim may be deleted.
DEAD_LETTERED_AT_HEADER = "x-dead-lettered-at"

# Outcomes whose message is republished (to a delay tier or the dead-letter queue).
_MOVES = frozenset((Outcome.RETRY_SCHEDULED, Outcome.DEAD_LETTERED, Outcome.MESSAGE_ID_REUSED))


@dataclass(frozen=True, slots=True, kw_only=True)
class Moved:
    """Where a republished message went."""

    tier: float | None = None  # the delay tier of a retry
    exhausted: bool = False  # a retry past the last attempt: dead-lettered instead


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

    async def settle(
        self,
        spec: HandlerSpec,
        decided: Sequence[tuple[Item, Verdict]],
        *,
        acks: AckWindow | None = None,
    ) -> None:
        """Publish the retries and dead letters of `decided`, log every outcome, then ack.

        `acks`: the window of a runner that settles jobs while others of the same
        channel are still unsettled (a multiple ack of the batch would cover them).
        """
        movers = [(item, verdict) for item, verdict in decided if verdict.outcome in _MOVES]
        results = (
            await asyncio.gather(
                *(self._move(spec, i, v) for i, v in movers), return_exceptions=True
            )
            if movers
            else []
        )
        moved: dict[Item, Moved | BaseException] = {
            item: result for (item, _), result in zip(movers, results, strict=True)
        }
        now = time.monotonic()
        lines = outcome_lines()
        tally: dict[tuple[Outcome, str], int] = {}
        unsettled: set[Item] = set()
        for item, verdict in decided:
            where = moved.get(item)
            if isinstance(where, BaseException):
                unsettled.add(item)
                if item.span is not None:  # given back to the broker: its next delivery
                    close_message(tracing(), item, Outcome.RETRY_SCHEDULED, verdict)
                continue
            key = self._log_outcome(spec, item, verdict, where, now, lines)
            tally[key] = tally.get(key, 0) + 1
        if lines is not None:
            lines.flush()
        metrics = self._metrics.consumer(spec.queue)
        metrics.settled(tally)
        await _acknowledge([item for item, _ in decided], unsettled, metrics, acks)

    async def _move(self, spec: HandlerSpec, item: Item, verdict: Verdict) -> Moved:
        """Republish `item` to a delay tier or the dead-letter queue, confirmed."""
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
            where = Moved(tier=tier)
        else:
            where = Moved(exhausted=retrying)
            headers[ATTEMPT_HEADER] = attempt
            headers[REASON_HEADER] = (
                f"max_attempts_exceeded:{verdict.reason}" if where.exhausted else verdict.reason
            )
            headers[QUEUE_HEADER] = spec.queue
            stamp_dead_lettered(headers)
            routing_key = dead_letter_queue(spec.queue)
        message = republished(delivery, headers)
        for attempt in range(1, PUBLISH_TRIES + 1):
            try:
                await self._exchange.publish(message, routing_key=routing_key)
                return where
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
        raise AssertionError("every publish try returns or raises")

    def _log_outcome(
        self,
        spec: HandlerSpec,
        item: Item,
        verdict: Verdict,
        where: Moved | None,
        now: float,
        lines: OutcomeLines | None,
    ) -> tuple[Outcome, str]:
        """Log the item's outcome line; return (outcome, reason) for the metrics."""
        envelope = item.envelope
        outcome = verdict.outcome
        if where is not None and where.exhausted:
            outcome = Outcome.DEAD_LETTERED
            reason = f"max_attempts_exceeded:{verdict.reason}"
        else:
            reason = verdict.reason if outcome is not Outcome.MESSAGE_ID_REUSED else ""
        trace_ids: dict[str, str] = {}
        if item.span is not None:  # the line joins the message's trace
            traces = tracing()
            trace_ids = traces.ids(item.span)
            close_message(traces, item, outcome, verdict)
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
        if where is not None and where.tier is not None:
            fields["delay_s"] = where.tier
        if trace_ids:
            fields.update(trace_ids)
        level = (
            "info"
            if outcome
            in (Outcome.EFFECT_COMMITTED, Outcome.DUPLICATE_IGNORED, Outcome.MESSAGE_CANCELLED)
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


async def _acknowledge(
    items: Sequence[Item], unsettled: set[Item], metrics: ConsumerMetrics, acks: AckWindow | None
) -> None:
    """Ack settled items (multiple=True per channel, or through `acks`); leave the rest to
    redelivery."""
    settled = [item for item in items if item not in unsettled]
    nacked = [item for item in items if item in unsettled]
    for item in nacked:
        # Could not be republished: give it back to the broker now rather
        # than acking it past (a multiple ack would cover it otherwise).
        await quietly(item.delivery.nack(requeue=True), item)
    if acks is not None:
        failed = await acks.settle(settled, nacked=nacked)
    else:
        failed = await _ack_per_channel(settled)
    if failed:
        metrics.acks_failed(failed)


async def _ack_per_channel(items: Sequence[Item]) -> int:
    """One multiple ack per channel, at its highest tag; returns the deliveries not acked."""
    highest: dict[object, Item] = {}  # by channel: one multiple ack each
    covered: dict[object, int] = {}  # deliveries each channel's one ack settles
    failed = 0
    for item in items:
        try:
            channel = item.delivery.channel
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
        covered[channel] = covered.get(channel, 0) + 1
        tag = item.delivery.delivery_tag or 0
        best = highest.get(channel)
        if best is None or tag > (best.delivery.delivery_tag or 0):
            highest[channel] = item
    for on, item in highest.items():
        if not await quietly(item.delivery.ack(multiple=True), item):
            failed += covered[on]
    return failed
