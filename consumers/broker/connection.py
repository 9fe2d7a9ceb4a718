"""The broker connection: several addresses, one robust connection.

aio-pika's `connect_robust` reconnects to the one URL it was given, so a
worker whose node died waits for that node. `connect()` here gives aio-pika's
`RobustConnection` a list instead, with the address chosen per attempt:

    start     the addresses in the given order; the first that answers wins;
              none answering raises the last one's error (the caller's
              process supervisor restarts it, as with one address)
    lost      the next address at once (round robin): a node that just died
              is the worst bet for the first attempt
    refused   the next address after a delay with full jitter,
              uniform(0, min(cap, base * 2**failures)): a fleet whose node
              died does not land on the next one in step
    back      `RobustConnection` restores what it restores on any reconnect:
              its channels, their qos, the queues declared on them and their
              consumers; publishes on a confirm channel wait for it

Every node of a cluster serves every queue (a quorum queue's leader may be
on another node; the node forwards), so moving costs one reconnect, and the
deliveries left unacked on the lost connection are redelivered by the
broker: the claim in PostgreSQL makes the redelivery a duplicate or a first
run, never a second effect.

Every connection opened here reads its frames a buffer at a time
(`consumers.broker.frames`), not aiormq's three reads a frame.

The hook is `_on_connection_close`, which aio-pika calls both when an open
connection is lost and when an attempt fails, before it sleeps
`reconnect_interval` and tries `url` again: both are set there. All
addresses should carry the same query parameters (the first one's are used).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import aio_pika
import structlog
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from yarl import URL

from consumers.broker import frames
from consumers.broker.consume import DirectChannel

log = structlog.get_logger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 15.0


def redacted(url: URL | str) -> str:
    url = URL(url)
    return str(url.with_password("***")) if url.password else str(url)


class ClusterConnection(aio_pika.RobustConnection):
    """A `RobustConnection` that moves round the addresses on every loss or failure.

    Its channels are `DirectChannel`s: a `DirectConsumer` consumes below
    aio-pika's per-delivery objects (`consumers.broker.consume`).
    """

    CHANNEL_CLASS = DirectChannel

    def __init__(
        self,
        urls: Sequence[str],
        *,
        first: int = 0,
        rng: random.Random | None = None,
        **kwargs: Any,
    ) -> None:
        self.urls = tuple(URL(u) for u in urls)
        self.index = first % len(self.urls)
        self.failures = 0  # attempts since the last open connection
        self.moves = 0  # address changes, for tests and logs
        self._rng = rng or random.Random()
        super().__init__(self.urls[self.index], **kwargs)

    async def _on_connected(self) -> None:
        await super()._on_connected()
        self.failures = 0
        log.info("amqp_connected", address=redacted(self.url), moves=self.moves)

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        was_open = self.connected.is_set()
        await super()._on_connection_close(closing)
        if self._close_called or self.is_closed or len(self.urls) == 1:  # aio-pika's own way
            return
        left = self.url
        self.index = (self.index + 1) % len(self.urls)
        self.url = self.urls[self.index]
        self.moves += 1
        if not was_open:
            self.failures += 1
        # Read by aio-pika for the sleep after a failed attempt only: a lost
        # connection is retried at once, on the next address.
        self.reconnect_interval = self._rng.uniform(
            0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**self.failures)
        )
        log.warning(
            "amqp_address_moved",
            lost=redacted(left),
            next=redacted(self.url),
            was_open=was_open,
            failures=self.failures,
            retry_in_s=round(self.reconnect_interval, 2) if not was_open else 0.0,
        )


async def connect(
    urls: Sequence[str], *, name: str, attempt_s: float = 10.0
) -> aio_pika.abc.AbstractRobustConnection:
    """A robust connection to the first of `urls` that answers; see the module docstring."""
    frames.install()
    error: BaseException | None = None
    for first in range(len(urls)):
        connection = ClusterConnection(
            urls,
            first=first,
            # Names the connection in `rabbitmqctl list_connections` and the UI.
            client_properties={"connection_name": name},
        )
        try:
            await connection.connect(timeout=attempt_s)
        except (*CONNECTION_EXCEPTIONS, TimeoutError) as exc:
            error = exc
            log.warning("amqp_address_refused", address=redacted(urls[first]), error=repr(exc))
            await connection.close()
            continue
        return connection
    assert error is not None
    raise error


async def connect_once(
    urls: Sequence[str], *, attempt_s: float = 10.0
) -> aio_pika.abc.AbstractConnection:
    """A plain connection to the first of `urls` that answers, for one-shot tools (dlq, inspect)."""
    frames.install()
    error: BaseException | None = None
    for url in urls:
        try:
            return await aio_pika.connect(url, timeout=attempt_s)
        except (*CONNECTION_EXCEPTIONS, TimeoutError) as exc:
            error = exc
            log.warning("amqp_address_refused", address=redacted(url), error=repr(exc))
    assert error is not None
    raise error
