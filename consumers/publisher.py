"""Publish send jobs the way the message contract wants them.

JSON body, `message_id` set (the dedupe key: keep it on every retry), tenant
in `x-tenant`, persistent delivery, and a publisher confirm awaited before
`publish` returns, so a job the call reports as sent is on the broker's disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aio_pika

from consumers.envelope import MAX_MESSAGE_ID_BYTES, TENANT_HEADER


def job_message(
    body: Mapping[str, Any] | bytes,
    *,
    message_id: str,
    tenant: str = "",
    headers: Mapping[str, Any] | None = None,
) -> aio_pika.Message:
    """The AMQP message for one job (raw bytes are sent as they are)."""
    if not message_id or len(message_id.encode()) > MAX_MESSAGE_ID_BYTES:
        raise ValueError(f"message_id must be 1 to {MAX_MESSAGE_ID_BYTES} bytes")
    all_headers: dict[str, Any] = dict(headers or {})
    if tenant:
        all_headers[TENANT_HEADER] = tenant
    return aio_pika.Message(
        body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode(),
        message_id=message_id,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=all_headers or None,
    )


class Publisher:
    """Publishes jobs to queues through the default exchange, with confirms."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel) -> None:
        self._exchange = channel.default_exchange

    @classmethod
    async def connect(cls, url: str) -> tuple[Publisher, aio_pika.abc.AbstractConnection]:
        """A publisher on a new connection (close the connection when done)."""
        connection = await aio_pika.connect_robust(url)
        channel = await connection.channel(publisher_confirms=True)
        return cls(channel), connection

    async def publish(
        self,
        queue: str,
        body: Mapping[str, Any] | bytes,
        *,
        message_id: str,
        tenant: str = "",
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        await self._exchange.publish(
            job_message(body, message_id=message_id, tenant=tenant, headers=headers),
            routing_key=queue,
        )

    async def publish_message(self, queue: str, message: aio_pika.Message) -> None:
        """Publish a prepared message (bad input for tests, replays from the DLQ)."""
        await self._exchange.publish(message, routing_key=queue)
