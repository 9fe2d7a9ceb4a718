"""A user's App on the real RabbitMQ and PostgreSQL, in the test's process, then nothing left.

    async with TestWorker(app, setup_sql=SCHEMA) as worker:
        await worker.publish("orders.shipped", {"order_id": 1042}, message_id="order-1042-shipped")
        await worker.committed("order-1042-shipped")
        assert await worker.db.fetchval("SELECT count(*) FROM shipments") == 1

Entering it:

1. migrates a schema of its own (`test_<random>`) and runs `setup_sql` there
   (the app's own tables); `worker.db` is a connection whose search_path
   starts with it, as the worker's pool's does;
2. gives every queue of the app a name of its own on the broker: `orders.shipped`
   becomes `test-<random>.orders.shipped` (`worker.queues`), so tests that run at
   once, on one broker, never take each other's messages (what that means for
   consumer names and dedupe keys: `consumers.testing.isolation`);
3. starts the real `Worker` on a copy of the app under those names, with no
   relay: what a handler `ctx.emit()`s stays in the schema's outbox
   (`worker.emitted()`), since it names the app's queues, not the test's.

Leaving it, whatever happened inside (a failed assertion, a start that failed
half way): the worker stops, then every queue it declared goes (work queue,
retry tiers, dead letters) and the schema is dropped. Each step runs even if
one before it failed, and each is bounded by `SERVICE_DEADLINE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

import aio_pika
import asyncpg

from consumers.broker.topology import delete
from consumers.handlers.app import App
from consumers.message.envelope import TENANT_HEADER
from consumers.publishing.publisher import Publisher, job_message
from consumers.runtime.worker import Worker
from consumers.settings import Settings
from consumers.testing.isolation import Isolation, names_on_broker
from consumers.testing.outcomes import (
    COMMITTED,
    DEAD,
    IGNORED,
    RETRIED,
    Awaited,
    OutcomeLine,
    OutcomeTap,
)
from consumers.testing.services import Services
from dedupe import DbConnection, migrate, quote_ident

T = TypeVar("T")

# One call to a service that answers in milliseconds when it is there.
SERVICE_DEADLINE_S = 30.0
OUTCOME_DEADLINE_S = 30.0  # a wait for an outcome, unless the call says otherwise


@dataclass(frozen=True, slots=True, kw_only=True)
class Emitted:
    """A follow-up a handler emitted: a row of the temporary schema's outbox."""

    queue: str
    message_id: str
    tenant: str
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class TestWorker:
    """Runs `app` against `services` on queues and a schema of its own (see the module)."""

    __test__ = False  # a class pytest must not collect, though its name starts with Test

    def __init__(
        self,
        app: App,
        *,
        services: Services | None = None,
        setup_sql: str | Sequence[str] = (),
        settings: Settings | None = None,
    ) -> None:
        self.services = services or Services()
        isolation = Isolation.fresh()  # names of its own: consumers.testing.isolation
        self.prefix = isolation.prefix
        self.schema = isolation.schema
        self.queues = isolation.queues(app)  # the app's name -> the name on the broker
        self.app = isolation.app(app)
        self.settings = isolation.settings(settings, self.services)
        self._setup_sql = [setup_sql] if isinstance(setup_sql, str) else list(setup_sql)
        self._tap = OutcomeTap(names_on_broker(isolation, app))
        self._published: dict[tuple[str, str, str], int] = {}
        self._db: DbConnection | None = None
        self._publisher: Publisher | None = None
        self._stack = contextlib.AsyncExitStack()

    @property
    def db(self) -> DbConnection:
        """A connection to the test's schema (first on its search_path), for set-up and checks."""
        if self._db is None:
            raise RuntimeError("the TestWorker is not running: use it in `async with`")
        return self._db

    async def __aenter__(self) -> Self:
        try:
            await self._start(self._stack)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        """Each resource is registered for removal before it is made (exits run in reverse)."""
        db = await _bounded("a PostgreSQL connection", self._connect_db())
        stack.push_async_callback(lambda: _bounded("closing the connection", db.close()))
        stack.push_async_callback(self._drop_schema, db)
        await _bounded(f"migrating schema {self.schema}", migrate(db, self.schema))  # 1.
        for sql in self._setup_sql:
            await _bounded("setup_sql", db.execute(sql))
        self._db = db
        connection = await aio_pika.connect(self.services.amqp_url, timeout=SERVICE_DEADLINE_S)
        stack.push_async_callback(
            lambda: _bounded("closing the AMQP connection", connection.close())
        )
        stack.push_async_callback(self._delete_queues, connection)  # 2.
        channel = await _bounded("a channel", connection.channel(publisher_confirms=True))
        self._publisher = Publisher(channel)
        self._tap.attach()
        stack.callback(self._tap.detach)
        worker = Worker(self.app, self.settings)  # 3.
        stack.push_async_callback(lambda: _bounded("the worker's stop", worker.stop()))
        await _bounded("the worker's start", worker.start())

    async def _connect_db(self) -> DbConnection:
        conn: DbConnection = await asyncpg.connect(
            self.services.database_url,
            timeout=SERVICE_DEADLINE_S,
            server_settings={"search_path": f"{quote_ident(self.schema)}, public"},
        )
        return conn

    async def _drop_schema(self, db: DbConnection) -> None:
        sql = f"DROP SCHEMA IF EXISTS {quote_ident(self.schema)} CASCADE"
        await _bounded(f"dropping schema {self.schema}", db.execute(sql))

    async def _delete_queues(self, connection: aio_pika.abc.AbstractConnection) -> None:
        channel = await _bounded("a channel", connection.channel())  # one no error has closed
        for spec in self.app.specs.values():
            await _bounded(f"deleting {spec.queue}", delete(channel, spec.queue, spec.retry))

    # -- publishing ------------------------------------------------------------

    async def publish(
        self,
        queue: str,
        body: Mapping[str, Any] | bytes,
        *,
        message_id: str,
        tenant: str = "",
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        """Publish a job to the app's `queue` as a publisher would; return once confirmed."""
        message = job_message(body, message_id=message_id, tenant=tenant, headers=headers)
        await self.publish_message(queue, message)

    async def publish_message(self, queue: str, message: aio_pika.Message) -> None:
        """Publish an AMQP message as given (no message_id, a bad body: what a stranger sends)."""
        if queue not in self.queues:
            raise KeyError(f"the app has no queue {queue!r}; its queues: {sorted(self.queues)}")
        if self._publisher is None:
            raise RuntimeError("the TestWorker is not running: use it in `async with`")
        tenant = (message.headers or {}).get(TENANT_HEADER, "")
        key = (queue, str(tenant), message.message_id or "")
        self._published[key] = self._published.get(key, 0) + 1
        await _bounded(
            f"the confirm of {message.message_id!r}",
            self._publisher.publish_message(self.queues[queue], message),
        )

    # -- outcomes --------------------------------------------------------------

    async def committed(
        self,
        message_id: str,
        *,
        tenant: str = "",
        queue: str | None = None,
        timeout: float = OUTCOME_DEADLINE_S,
    ) -> OutcomeLine:
        """Await the message's `effect_committed`: its handler's effects committed."""
        awaited = Awaited(outcomes=COMMITTED, message_id=message_id, tenant=tenant, queue=queue)
        return await self.outcome(awaited, timeout=timeout)

    async def duplicate_ignored(
        self,
        message_id: str,
        *,
        tenant: str = "",
        queue: str | None = None,
        timeout: float = OUTCOME_DEADLINE_S,
    ) -> OutcomeLine:
        """Await `duplicate_ignored`: a copy of a message already done, acked with no effect."""
        awaited = Awaited(outcomes=IGNORED, message_id=message_id, tenant=tenant, queue=queue)
        return await self.outcome(awaited, timeout=timeout)

    async def retried(
        self,
        message_id: str,
        *,
        attempt: int | None = None,
        tenant: str = "",
        queue: str | None = None,
        timeout: float = OUTCOME_DEADLINE_S,
    ) -> OutcomeLine:
        """Await `retry_scheduled` (of `attempt`, the one that failed, if given)."""
        awaited = Awaited(
            outcomes=RETRIED, message_id=message_id, tenant=tenant, queue=queue, attempt=attempt
        )
        return await self.outcome(awaited, timeout=timeout)

    async def dead_lettered(
        self,
        message_id: str,
        *,
        reason: str | None = None,
        tenant: str = "",
        queue: str | None = None,
        timeout: float = OUTCOME_DEADLINE_S,
    ) -> OutcomeLine:
        """Await the message's dead letter (`message_id_reused` is one), with `reason` if given."""
        awaited = Awaited(
            outcomes=DEAD, message_id=message_id, tenant=tenant, queue=queue, reason=reason
        )
        return await self.outcome(awaited, timeout=timeout)

    async def outcome(
        self, awaited: Awaited, *, timeout: float = OUTCOME_DEADLINE_S
    ) -> OutcomeLine:
        """Await any outcome line `awaited` describes; raise `OutcomeNotSeen` if none comes."""
        published = sum(
            count
            for (queue, tenant, message_id), count in self._published.items()
            if message_id == awaited.message_id
            and tenant == awaited.tenant
            and (awaited.queue is None or queue == awaited.queue)
        )
        return await self._tap.wait(awaited, published=published, timeout=timeout)

    @property
    def lines(self) -> list[OutcomeLine]:
        """Every outcome line of the app's queues so far, in the order logged."""
        return list(self._tap.lines)

    async def emitted(self) -> list[Emitted]:
        """What handlers `ctx.emit()`ted, oldest first (the relay does not run here)."""
        rows = await _bounded(
            "reading the outbox",
            self.db.fetch(
                "SELECT queue, message_id, tenant, headers, body"
                f" FROM {quote_ident(self.schema)}.outbox ORDER BY id"
            ),
        )
        return [
            Emitted(
                queue=row["queue"],
                message_id=row["message_id"],
                tenant=row["tenant"],
                headers=json.loads(row["headers"]) if row["headers"] else {},
                body=bytes(row["body"]),
            )
            for row in rows
        ]


class WorkerFor(Protocol):
    """What the `worker_for` fixture gives: a `TestWorker` on the test's services."""

    def __call__(
        self,
        app: App,
        *,
        setup_sql: str | Sequence[str] = (),
        settings: Settings | None = None,
    ) -> TestWorker: ...


async def _bounded(what: str, step: Awaitable[T]) -> T:
    """`step`, or TimeoutError naming it after SERVICE_DEADLINE_S."""
    try:
        async with asyncio.timeout(SERVICE_DEADLINE_S):
            return await step
    except TimeoutError as exc:
        raise TimeoutError(f"{what}: no answer within {SERVICE_DEADLINE_S:g} s") from exc
