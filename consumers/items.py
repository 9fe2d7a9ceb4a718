"""A batch's deliveries as items: decoded, folded, each waiting for its verdict."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aio_pika

from consumers.envelope import BadInput, Envelope, decode
from consumers.verdict import DUPLICATE, REUSED, Verdict, dead
from dedupe import DedupeKey

if TYPE_CHECKING:
    from consumers.spec import HandlerSpec

Delivery = aio_pika.abc.AbstractIncomingMessage


@dataclass(slots=True)
class Item:
    delivery: Delivery
    envelope: Envelope | None
    verdict: Verdict | None = None
    started: float = field(default_factory=time.monotonic)
    tier: float | None = None  # the delay tier a retry went to
    exhausted: bool = False  # a retry past the last attempt: dead-lettered instead


def decode_batch(
    deliveries: Sequence[Delivery], spec: HandlerSpec, max_body_bytes: int
) -> list[Item]:
    """Decode every delivery; bad input and in-batch repeats get their verdict now.

    The same key twice in one batch: the first claims it, a later copy is a
    duplicate (same fingerprint) or a reuse (another one).
    """
    items: list[Item] = []
    first: dict[DedupeKey, Item] = {}
    for delivery in deliveries:
        envelope = decode(
            delivery,
            consumer=spec.queue,
            max_body_bytes=max_body_bytes,
            fingerprinter=spec.fingerprint,
        )
        if isinstance(envelope, BadInput):
            items.append(Item(delivery=delivery, envelope=None, verdict=dead(str(envelope))))
            continue
        item = Item(delivery=delivery, envelope=envelope)
        earlier = first.get(envelope.key)
        if earlier is None:
            first[envelope.key] = item
        else:
            assert earlier.envelope is not None
            same = earlier.envelope.fingerprint == envelope.fingerprint
            item.verdict = DUPLICATE if same else REUSED
        items.append(item)
    return items
