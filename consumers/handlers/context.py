"""What a handler gets: the transaction, the message, a bound logger, and `emit`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from consumers.message.decisions import ConfigurationError
from dedupe import DbConnection, Outbox

_log = structlog.get_logger("consumers.handler")


class Context:
    """One message as a handler sees it.

    `tx` is the asyncpg connection, inside the batch's transaction: write the
    effects there and they commit exactly once with the message's claim.
    `stage()` queues a statement to run once for the whole batch
    (`executemany`), which saves a round trip per message. `emit()` writes a
    follow-up message to the outbox, in the same transaction.
    """

    __slots__ = (
        "_log",
        "_outbox",
        "_staged",
        "_trace_headers",
        "attempt",
        "body",
        "consumer",
        "message_id",
        "tenant",
        "tx",
    )

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
        outbox: Outbox | None = None,
        trace_headers: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.tx = tx
        self.body = body
        self.message_id = message_id
        self.tenant = tenant
        self.attempt = attempt
        self.consumer = consumer
        self._staged = staged
        self._outbox = outbox
        # The message's trace context, made only if it emits (tracing on).
        self._trace_headers = trace_headers
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

    async def emit(
        self,
        queue: str,
        body: Mapping[str, Any] | bytes,
        *,
        message_id: str,
        tenant: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Publish a follow-up message to `queue` if and only if this message's effects commit.

        It is written to the outbox as one of this message's effects (staged
        like `stage()`), and a relay publishes it after the commit. A handler
        that raises takes its emits with it; a duplicate, whose handler does
        not run, emits nothing again. `message_id` should be derived from this
        message's (`f"{ctx.message_id}:receipt"`), so that the follow-up of a
        message has one id however often its effects are attempted. `tenant`
        defaults to this message's. With tracing on, the follow-up carries this
        message's trace (`traceparent`), unless `headers` give one.
        """
        if self._outbox is None:
            raise ConfigurationError("emit() needs a Context made by a worker: it has no outbox")
        if self._trace_headers is not None:
            headers = {**self._trace_headers(), **(headers or {})}
        args = Outbox.row_args(
            queue=queue,
            body=body,
            message_id=message_id,
            tenant=self.tenant if tenant is None else tenant,
            headers=headers,
        )
        await self.stage(self._outbox.insert_sql, *args)


class Batch:
    """What a batch handler gets: the messages of one transaction."""

    __slots__ = ("messages", "tx")

    def __init__(self, *, tx: DbConnection, messages: Sequence[Context]) -> None:
        self.tx = tx
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)
