"""A batch's spans, when tracing is on (`consumers.telemetry.tracing`); nothing when off.

Following the messaging semantic conventions for a batch that is processed
together:

- one "process <queue>" CONSUMER span per delivery, a child of the context its
  publisher put in the headers (ours, pika's, kombu's: any W3C `traceparent`),
  with `messaging.system=rabbitmq`, `messaging.destination.name`,
  `messaging.message.id`, `messaging.operation.type=process`; it is the current
  span while the message's handler runs, its context goes into what the
  handler emits, and it ends when the message is settled, with
  `idempotent_workers.outcome` (`effect_committed`, `duplicate_ignored`,
  `retry_scheduled`, `dead_lettered`, ...) and `idempotent_workers.reason`;
- one "process <queue>" span for the batch, linked from every message's span,
  holding the batch's database steps as children ("claim", "commit",
  "record"), each with `db.system.name=postgresql`. (It does not link back to
  each message: a link costs the exporter as much to encode as the message's
  own span already says.)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from consumers.message.verdict import Outcome, Verdict
from consumers.pipeline.deliveries import Item
from consumers.telemetry.tracing import Span, SpanKind, Tracing

# Outcomes that are not the message's success: its span is marked an error.
_ERRORS = frozenset((Outcome.DEAD_LETTERED, Outcome.MESSAGE_ID_REUSED, Outcome.RETRY_SCHEDULED))


def open_batch(traces: Tracing, queue: str, items: Sequence[Item]) -> Span | None:
    """The batch's span and each item's message span (set on `item.span`)."""
    if not traces.on:
        return None
    started = time.time_ns()
    batch = traces.span(
        f"process {queue}",
        SpanKind.CONSUMER,
        parent={},  # a root: the messages' own contexts are its links
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.destination.name": queue,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.batch.message_count": len(items),
        },
        start_time=started,
    )
    for item in items:
        attributes: dict[str, str | int | float | bool] = {
            "messaging.system": "rabbitmq",
            "messaging.destination.name": queue,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
        }
        if item.delivery.message_id:
            attributes["messaging.message.id"] = item.delivery.message_id
        if item.envelope is not None:
            attributes["idempotent_workers.attempt"] = item.envelope.attempt
        item.span = traces.span(
            f"process {queue}",
            SpanKind.CONSUMER,
            parent=item.delivery.headers or {},
            attributes=attributes,
            links=[batch] if batch is not None else [],
            start_time=started,
        )
    return batch


def step(traces: Tracing, name: str, batch: Span | None, **attributes: str | int) -> Span | None:
    """A database step of the batch ("claim", "commit", "record"), a child of its span."""
    if batch is None:
        return None
    return traces.span(
        name,
        SpanKind.CLIENT,
        parent=batch,
        attributes={"db.system.name": "postgresql", "db.operation.name": name, **attributes},
    )


def close_message(traces: Tracing, item: Item, outcome: Outcome, verdict: Verdict) -> None:
    """End a settled message's span with its outcome."""
    span = item.span
    if span is None:
        return
    span.set_attribute("idempotent_workers.outcome", str(outcome))
    if verdict.reason:
        span.set_attribute("idempotent_workers.reason", verdict.reason)
    if outcome in _ERRORS:
        traces.fail(span, verdict.reason or str(outcome))
    span.end()
    item.span = None
