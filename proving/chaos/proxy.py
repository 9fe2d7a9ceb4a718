"""A TCP fault proxy: pass, add latency, reset, hold half-open, cut a COMMIT.

Workers reach RabbitMQ and PostgreSQL only through one of these, so the
chaos run can break their connections without touching the services:

    pass          bytes flow both ways (the default)
    latency       every chunk waits `seconds` before it is forwarded
    reset         every open connection is aborted with a TCP RST, both sides
    hold          nothing flows, nothing closes (a half-open partition); new
                  connections hang too; after `seconds` they are all reset
    cut_commit    the next client chunk carrying a COMMIT is forwarded, then
                  the client's side is aborted before any reply: the worker
                  cannot know whether its transaction committed

asyncpg commits with a simple-protocol Query (`Q` ... `COMMIT;`), so the
cut looks for the bytes `COMMIT` in a client-to-server chunk. The server's
side is closed either with a FIN right after the forward (the server reads
the COMMIT first and commits) or with a RST (it may not): both outcomes must
be harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct

import structlog

log = structlog.get_logger(__name__)

_CHUNK = 65536


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One client connection and its upstream twin."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.tasks: list[asyncio.Task[None]] = []

    def reset(self) -> None:
        _abort(self.client)
        _abort(self.server)
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Listens on 127.0.0.1:`port` and forwards to `upstream_host`:`upstream_port`."""

    def __init__(
        self,
        name: str,
        port: int,
        upstream_port: int,
        *,
        upstream_host: str = "127.0.0.1",
        seed: int = 0,
    ) -> None:
        self.name = name
        self.port = port
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.latency = 0.0
        self._holding: asyncio.Event = asyncio.Event()
        self._holding.set()  # set: flowing; clear: held
        self._cuts_armed = 0
        self.cuts_done = 0
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._rng = random.Random(seed)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    @property
    def connections(self) -> int:
        return len(self._links)

    @property
    def holding(self) -> bool:
        """Whether a hold (`hold()`) is stopping the traffic now."""
        return not self._holding.is_set()

    # -- faults ---------------------------------------------------------

    def reset(self) -> int:
        """Abort every open connection; returns how many there were."""
        links = list(self._links)
        for link in links:
            link.reset()
        self._links.clear()
        return len(links)

    async def hold(self, seconds: float) -> None:
        """Stop all traffic for `seconds` without closing, then reset."""
        self._holding.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.reset()
            self._holding.set()

    async def delay(self, latency: float, seconds: float) -> None:
        """Add `latency` to every chunk for `seconds`."""
        self.latency = latency
        try:
            await asyncio.sleep(seconds)
        finally:
            self.latency = 0.0

    def arm_commit_cut(self) -> None:
        """Cut the connection that sends the next COMMIT, before its reply."""
        self._cuts_armed += 1

    @property
    def cuts_pending(self) -> int:
        return self._cuts_armed

    def disarm(self) -> None:
        self._cuts_armed = 0

    # -- plumbing -------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._holding.wait()  # unbounded: a hold ends when its fault does (hold())
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.upstream_host, self.upstream_port), 10
            )
        except (OSError, TimeoutError):
            _abort(writer)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(link, reader, up_writer, upstream=True)),
            asyncio.create_task(self._pump(link, up_reader, writer, upstream=False)),
        ]
        await asyncio.gather(*link.tasks, return_exceptions=True)
        self._links.discard(link)
        for w in (writer, up_writer):
            with contextlib.suppress(Exception):
                w.close()

    async def _pump(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        try:
            # unbounded: a link pumps for as long as both its ends keep it open
            while data := await reader.read(_CHUNK):  # unbounded: as above
                await self._holding.wait()  # unbounded: a hold ends when its fault does
                if self.latency:
                    await asyncio.sleep(self.latency)
                writer.write(data)
                await writer.drain()  # unbounded: the peer reads at its pace, or the link ends
                if upstream and self._cuts_armed and b"COMMIT" in data:
                    self._cuts_armed -= 1
                    self.cuts_done += 1
                    self._cut(link)
                    return
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()
        except (OSError, asyncio.IncompleteReadError):
            link.reset()
        finally:
            if not upstream:
                # The server side ended: end the client's side too.
                with contextlib.suppress(Exception):
                    writer.close()

    def _cut(self, link: _Link) -> None:
        _abort(link.client)  # the worker never sees the reply
        if self._rng.random() < 0.5:
            link.server.close()  # FIN after the COMMIT: the server commits
        else:
            _abort(link.server)  # RST: the COMMIT may or may not be read
        for task in link.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self._links.discard(link)
        log.info("proxy_commit_cut", proxy=self.name)
