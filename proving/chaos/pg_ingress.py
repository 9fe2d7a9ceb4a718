"""The send API in the pg-failover load: `serve` on the cluster, each 202 checked at the end.

1. Start `idempotent-workers serve` (a Fleet of one, `serve_command`) on the
   cluster's multi-host DSN, its jobs going to chaos.ingress (a queue the run
   declares and nobody consumes), with an API key made for the run.
2. Send `requests` push jobs spread over the load, each with its own
   idempotency key, through `SendClient` (retried with the same key through
   503s and failovers); keep the id of each one answered 202.
3. The run's relays publish each accepted job from the outbox to chaos.ingress.
4. At the end, per id answered 202 (a promise the job is durable):
     missing      its message row is absent on the final primary: acked but missing
     unpublished  its job (`ingress-<id>`) never reached chaos.ingress: lost
   A job published twice (a relay's mark lost in a failover) is no fault:
   the worker's claim absorbs it.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import asyncpg

from consumers import push_job_body
from dedupe.messages import JOB_PREFIX
from ingress.client import Backoff, SendClient, SendError
from ingress.keys import ApiKeys
from providers import Platform, Target
from proving.deadlines import ANSWER_S, within

INGRESS_QUEUE = "chaos.ingress"
TENANT = "acme"
LISTEN_S = 60.0  # for serve to say where it listens
SENDERS = 4  # requests in flight at once

# Through a failover (a 10 s leader ttl) serve answers 503 with Retry-After: 1.
BACKOFF = Backoff(base_seconds=0.2, cap_seconds=2.0, max_attempts=60)


@dataclass(slots=True, kw_only=True)
class IngressLoad:
    """What the load sent and what the server promised."""

    requests: int = 0
    accepted: set[str] = field(default_factory=set)  # ids answered 202
    gave_up: int = 0  # requests that never got a final answer (no promise made)


async def api_key(conn: asyncpg.Connection, schema: str) -> str:
    """1. A key for the run's tenant (the schema migrated already)."""
    return await ApiKeys(schema).create(conn, TENANT)


def serve_command(port: int) -> tuple[str, ...]:
    """What follows `python -m`: one port, so a restarted `serve` is where it was."""
    return ("consumers", "serve", "--port", str(port), "--queue", INGRESS_QUEUE)


async def serve_url(log: Path) -> str:
    """1. The base URL of the `serve` writing `log`, once it says where it listens."""
    ends = time.monotonic() + LISTEN_S
    while time.monotonic() < ends:
        said = await asyncio.to_thread(_read, log)
        if found := re.search(r"listening on (http://\S+)", said):
            return found[1]
        await asyncio.sleep(0.2)
    raise RuntimeError(f"serve did not say where it listens within {LISTEN_S:.0f} s: {log}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


async def send_all(url: str, key: str, *, requests: int, seconds: float, seed: int) -> IngressLoad:
    """2. `requests` jobs spread over `seconds`, SENDERS at a time."""
    load = IngressLoad(requests=requests)
    started = time.monotonic()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(requests):
        queue.put_nowait(n)

    async def sender(client: SendClient) -> None:
        while not queue.empty():
            n = queue.get_nowait()
            if (wait := started + n * seconds / requests - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            target = Target(platform=Platform.IOS, token=f"{seed:08x}{n:056x}")
            job = push_job_body(targets=[target], title=f"pg-failover {n}")
            try:
                sent = await client.send(job, idempotency_key=f"pg-failover-{seed}-{n}")
            except SendError:
                load.gave_up += 1
            else:
                load.accepted.add(sent.id)

    async with SendClient(url, api_key=key, timeout_seconds=10.0, backoff=BACKOFF) as client:
        # unbounded: each request is bounded by the client's timeout and attempts
        await asyncio.gather(*(sender(client) for _ in range(SENDERS)))
    return load


async def published_ids(amqp_url: str) -> set[str]:
    """4. The ids of the jobs in chaos.ingress (read, never acked: they stay)."""
    seen: set[str] = set()
    connection = await aio_pika.connect(amqp_url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel())
        queue = await channel.declare_queue(INGRESS_QUEUE, passive=True, timeout=ANSWER_S)
        while (message := await queue.get(fail=False, timeout=ANSWER_S)) is not None:
            if (message.message_id or "").startswith(JOB_PREFIX):
                seen.add((message.message_id or "").removeprefix(JOB_PREFIX))
    finally:
        await connection.close()
    return seen


async def missing_rows(conn: asyncpg.Connection, ids: set[str]) -> int:
    """4. Ids answered 202 whose message row the final primary lacks."""
    found = await conn.fetchval(
        "SELECT count(*) FROM ingress_messages WHERE id = ANY($1::uuid[])",
        sorted(ids),
        timeout=ANSWER_S,
    )
    return len(ids) - int(found)
