"""The bench's own corner of the services: one schema, one work queue.

Every variant consumes the same work queue (declared with the worker's
topology, so all of them see the same queue arguments) and writes to the same
`effects` table in a schema of its own; both are dropped when the bench ends.
The dedupe consumer name is the queue name, as it is for the worker.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import aio_pika
import asyncpg

from consumers import AmqpSettings, RetryPolicy
from consumers.broker.topology import declare, delete
from dedupe import migrate, quote_ident
from proving.deadlines import ANSWER_S

EFFECTS_TABLE = """
CREATE TABLE effects (
    consumer    text   NOT NULL,
    tenant      text   NOT NULL,
    message_id  text   NOT NULL,
    order_id    bigint NOT NULL,
    total_cents bigint NOT NULL
)"""

# One message's effect, and a batch's effects in one statement.
INSERT_EFFECT = (
    "INSERT INTO effects (consumer, tenant, message_id, order_id, total_cents)"
    " VALUES ($1, $2, $3, $4, $5)"
)
INSERT_EFFECTS = (
    "INSERT INTO effects (consumer, tenant, message_id, order_id, total_cents)"
    " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[])"
)
# The hand-written consumers' claim of one key (the worker uses dedupe.Inbox): the
# statement that claims across generations (migration 0012), a row if it claimed.
CLAIM_ONE = (
    "SELECT true FROM claim_messages(ARRAY[$1]::text[], ARRAY[$2]::text[],"
    " ARRAY[$3]::text[], ARRAY[$4]::bytea[])"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sandbox:
    schema: str
    queue: str
    retry: RetryPolicy
    amqp: AmqpSettings

    @classmethod
    def fresh(cls, amqp: AmqpSettings) -> Sandbox:
        tag = uuid.uuid4().hex[:10]
        return cls(schema=f"bench_{tag}", queue=f"bench.{tag}", retry=RetryPolicy(), amqp=amqp)

    @property
    def search_path(self) -> dict[str, str]:
        """asyncpg `server_settings` that put the bench schema first."""
        return {"search_path": f"{quote_ident(self.schema)}, public"}

    async def create(self, conn: asyncpg.Connection, channel: aio_pika.abc.AbstractChannel) -> None:
        await migrate(conn, self.schema)
        await conn.execute(f"SET search_path TO {quote_ident(self.schema)}", timeout=ANSWER_S)
        await conn.execute(EFFECTS_TABLE, timeout=ANSWER_S)
        await declare(channel, self.queue, self.retry, self.amqp)

    async def reset(self, conn: asyncpg.Connection, *, keep_claims: bool) -> None:
        """Empty the effects (and, unless kept, the claims) before a run."""
        tables = "effects" if keep_claims else "effects, processed_messages"
        await conn.execute(f"TRUNCATE {tables}", timeout=ANSWER_S)

    async def effects(self, conn: asyncpg.Connection) -> tuple[int, int]:
        """(effect rows, distinct message_ids among them) since the last reset."""
        row = await conn.fetchrow(
            "SELECT count(*), count(DISTINCT message_id) FROM effects", timeout=ANSWER_S
        )
        assert row is not None
        return int(row[0]), int(row[1])

    async def drop(self, conn: asyncpg.Connection, channel: aio_pika.abc.AbstractChannel) -> None:
        await conn.execute(
            f"DROP SCHEMA IF EXISTS {quote_ident(self.schema)} CASCADE", timeout=ANSWER_S
        )
        await delete(channel, self.queue, self.retry)
