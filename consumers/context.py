"""What a handler gets: the transaction, the message, and a bound logger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from dedupe import DbConnection

_log = structlog.get_logger("consumers.handler")


class Context:
    """One message as a handler sees it.

    `tx` is the asyncpg connection, inside the batch's transaction: write the
    effects there and they commit exactly once with the message's claim.
    `stage()` queues a statement to run once for the whole batch
    (`executemany`), which saves a round trip per message.
    """

    __slots__ = ("_log", "_staged", "attempt", "body", "consumer", "message_id", "tenant", "tx")

    def __init__(
        self,
        *,
        tx: DbConnection,
        body: Mapping[str, Any],
        message_id: str,
        tenant: str,
        attempt: int,
        consumer: str,
        staged: dict[str, list[Sequence[Any]]] | None = None,
    ) -> None:
        self.tx = tx
        self.body = body
        self.message_id = message_id
        self.tenant = tenant
        self.attempt = attempt
        self.consumer = consumer
        self._staged = staged
        self._log: Any = None

    @property
    def log(self) -> Any:
        """A structlog logger bound to consumer, tenant, message_id and attempt."""
        if self._log is None:
            self._log = _log.bind(
                consumer=self.consumer,
                tenant=self.tenant,
                message_id=self.message_id,
                attempt=self.attempt,
            )
        return self._log

    async def stage(self, sql: str, *args: Any) -> None:
        """Run `sql` with `args` as part of this message's effects.

        On the fast path the statement is batched with the same statement of
        the other messages into one `executemany` before commit; when a batch
        is re-run to isolate a failing message it runs at once, inside the
        message's savepoint. Either way it commits exactly once, with the claim.
        """
        if self._staged is None:
            await self.tx.execute(sql, *args)
        else:
            self._staged.setdefault(sql, []).append(args)


class Batch:
    """What a batch handler gets: the messages of one transaction."""

    __slots__ = ("messages", "tx")

    def __init__(self, *, tx: DbConnection, messages: Sequence[Context]) -> None:
        self.tx = tx
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)
