"""A batch's deliveries as items; decoding tells the decided from the pending."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from consumers.broker.consume import Delivery
from consumers.message.envelope import BadInput, Envelope, decode
from consumers.message.verdict import DUPLICATE, REUSED, Verdict, dead
from dedupe import DedupeKey

if TYPE_CHECKING:
    from consumers.handlers.spec import HandlerSpec
    from consumers.telemetry.tracing import Span

__all__ = ["Decoded", "Delivery", "Item", "Verdicts", "decode_batch"]


@dataclass(eq=False, slots=True)
class Item:
    """One delivery of a batch. Hashes by identity: a batch's verdicts are keyed by it.

    `span`: its "process" span while tracing is on (`consumers.pipeline.traced`)."""

    delivery: Delivery
    envelope: Envelope | None
    started: float = field(default_factory=time.monotonic)
    span: Span | None = None


# What happens to each item of a batch, keyed by the item itself.
Verdicts = dict[Item, Verdict]


@dataclass(frozen=True, slots=True, kw_only=True)
class Decoded:
    """A batch after decoding: verdicts reached without the database, and the rest."""

    decided: list[tuple[Item, Verdict]]
    pending: list[Item]  # each with an envelope, its key's first copy in the batch


def decode_batch(deliveries: Sequence[Delivery], spec: HandlerSpec, max_body_bytes: int) -> Decoded:
    """Decode every delivery; bad input and in-batch repeats are decided now.

    The same key twice in one batch: the first claims it, a later copy is a
    duplicate (same fingerprint) or a reuse (another one).
    """
    decided: list[tuple[Item, Verdict]] = []
    pending: list[Item] = []
    first: dict[DedupeKey, Envelope] = {}
    for delivery in deliveries:
        envelope = decode(
            delivery,
            consumer=spec.queue,
            max_body_bytes=max_body_bytes,
            fingerprinter=spec.fingerprint,
        )
        if isinstance(envelope, BadInput):
            decided.append((Item(delivery=delivery, envelope=None), dead(str(envelope))))
            continue
        item = Item(delivery=delivery, envelope=envelope)
        earlier = first.get(envelope.key)
        if earlier is None:
            first[envelope.key] = envelope
            pending.append(item)
        else:
            same = earlier.fingerprint == envelope.fingerprint
            decided.append((item, DUPLICATE if same else REUSED))
    return Decoded(decided=decided, pending=pending)
