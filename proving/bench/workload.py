"""The messages a bench run consumes: persistent ~300-byte JSON send jobs.

`publish_backlog` fills a queue before a run starts, so a run measures the
consumer, not the publisher. (Paced publishing, for latency at a steady load,
runs in its own process: `proving.bench.pacer`.)
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid

import aio_pika

from consumers import TENANT_HEADER

TENANT = "acme"
CHUNK = 1000  # publishes in flight at once while filling a backlog


def job(n: int, rng: random.Random) -> aio_pika.Message:
    """Send job number `n`: a shipment notice of about 300 bytes."""
    body = {
        "type": "order_shipped",
        "order_id": 100_000 + n,
        "customer_id": f"cus_{rng.getrandbits(48):012x}",
        "currency": "EUR",
        "total_cents": rng.randrange(500, 500_000),
        "items": [
            {"sku": f"SKU-{rng.randrange(100_000):05d}", "qty": rng.randrange(1, 5)}
            for _ in range(3)
        ],
        "tracking": f"JD{rng.getrandbits(64):020d}",
        "shipped_at": "2024-05-04T10:21:33Z",
    }
    return aio_pika.Message(
        json.dumps(body).encode(),
        message_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers={TENANT_HEADER: TENANT},
    )


async def publish_backlog(
    channel: aio_pika.abc.AbstractChannel, queue: str, count: int, *, seed: int
) -> None:
    """Publish `count` jobs to `queue`, confirmed, in chunks of CHUNK at once."""
    rng = random.Random(seed)
    exchange = channel.default_exchange
    for start in range(0, count, CHUNK):
        await asyncio.gather(
            *(
                exchange.publish(job(n, rng), routing_key=queue)
                for n in range(start, min(count, start + CHUNK))
            )
        )
