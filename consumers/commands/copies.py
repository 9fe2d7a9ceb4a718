"""What a replay publishes of a dead letter: the same message, the framework's marks dropped.

Kept as they came: the body, the message_id (so the claim decides whether the
replay runs), the tenant and every header a publisher set, the first
dead-letter date (`x-dead-lettered-at`: a replay that fails again keeps it,
so retention is counted from the first failure). Dropped: the reason, error,
attempt and original queue the framework wrote when it dead-lettered the
message, and the broker's `x-death` records, all set again if it fails again;
the attempts start over.

`dlq replay` publishes this copy, and its dry run decodes this same copy
(`consumers.commands.dry_run`): what the worker will be handed.
"""

from __future__ import annotations

from typing import Any

import aio_pika

from consumers.message.envelope import ATTEMPT_HEADER, REASON_HEADER
from consumers.pipeline.settle import ERROR_HEADER, QUEUE_HEADER

DROPPED_HEADERS = frozenset(
    {REASON_HEADER, ERROR_HEADER, ATTEMPT_HEADER, QUEUE_HEADER, "x-death", "x-delivery-count"}
)
DROPPED_PREFIXES = ("x-first-death-", "x-last-death-")


def replayed_copy(message: aio_pika.abc.AbstractIncomingMessage) -> aio_pika.Message:
    """The message a replay publishes of `message`: persistent, its framework marks dropped."""
    headers: dict[str, Any] = {
        name: value
        for name, value in (message.headers or {}).items()
        if name not in DROPPED_HEADERS and not name.startswith(DROPPED_PREFIXES)
    }
    return aio_pika.Message(
        message.body,
        headers=headers,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        type=message.type,
        timestamp=message.timestamp,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )
