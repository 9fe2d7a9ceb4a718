"""Publish AMQP messages byte for byte as given, including what no client library would send.

aiormq (under aio-pika) gives every message published without a `message_id`
a random one, and pamqp refuses to encode a string that is not UTF-8. Other
clients send both, and the broker passes them on unchecked. This speaks just
enough AMQP 0-9-1 to publish such messages with confirms: it encodes the
properties and header tables itself, so a `bytes` value goes on the wire as
those bytes (a short string property, a long string header value, a table key).

    async with await RawPublisher.connect() as raw:
        await raw.publish("orders", b'{"n": 1}', RawProperties(message_id=b"\\xff"))

The decode tests, the fuzz command and the chaos run's decode poison use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self
from urllib.parse import unquote, urlsplit

from pamqp import commands, frame
from pamqp import heartbeat as _heartbeat  # noqa: F401 - registers the frame type

from proving.deadlines import deadline, within

# A header value as it goes on the wire: bytes and str are long strings (str
# encoded as UTF-8, bytes as given), bytearray a byte array, and so on.
RawValue = (
    bytes
    | bytearray
    | str
    | bool
    | int
    | float
    | None
    | Sequence["RawValue"]
    | Mapping[bytes | str, "RawValue"]
)
RawTable = Mapping[bytes | str, RawValue]

_FRAME_END = b"\xce"
# A frame the broker owes us (a reply, a confirm): seconds, even from a busy node.
READ_DEADLINE_S = 30.0
_BASIC_CLASS = 60


@dataclass(frozen=True, slots=True, kw_only=True)
class RawProperties:
    """The Basic properties a message may carry; None leaves one out."""

    content_type: bytes | str | None = None
    content_encoding: bytes | str | None = None
    headers: RawTable | None = None
    delivery_mode: int | None = 2
    priority: int | None = None
    correlation_id: bytes | str | None = None
    message_id: bytes | str | None = None
    type: bytes | str | None = None
    app_id: bytes | str | None = None


def _text(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _short(value: bytes | str) -> bytes:
    raw = _text(value)
    if len(raw) > 255:
        raise ValueError(f"a short string holds 255 bytes at most, not {len(raw)}")
    return bytes([len(raw)]) + raw


def _long(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def encode_value(value: RawValue) -> bytes:
    """One field value with its type tag (the RabbitMQ errata's tags)."""
    if isinstance(value, bool):
        return b"t" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"l" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if value is None:
        return b"V"
    if isinstance(value, bytearray):
        return b"x" + _long(bytes(value))
    if isinstance(value, bytes | str):
        return b"S" + _long(_text(value))
    if isinstance(value, Mapping):
        return b"F" + encode_table(value)
    return b"A" + _long(b"".join(encode_value(v) for v in value))


def encode_table(table: RawTable) -> bytes:
    return _long(b"".join(_short(key) + encode_value(value) for key, value in table.items()))


_PROPERTY_FLAGS = (  # in wire order
    ("content_type", 1 << 15),
    ("content_encoding", 1 << 14),
    ("headers", 1 << 13),
    ("delivery_mode", 1 << 12),
    ("priority", 1 << 11),
    ("correlation_id", 1 << 10),
    ("message_id", 1 << 7),
    ("type", 1 << 5),
    ("app_id", 1 << 3),
)


def encode_properties(properties: RawProperties) -> bytes:
    flags = 0
    parts: list[bytes] = []
    for name, flag in _PROPERTY_FLAGS:
        value = getattr(properties, name)
        if value is None:
            continue
        flags |= flag
        if name == "headers":
            parts.append(encode_table(value))
        elif name in ("delivery_mode", "priority"):
            parts.append(bytes([value]))
        else:
            parts.append(_short(value))
    return struct.pack(">H", flags) + b"".join(parts)


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + _FRAME_END


class BrokerRefused(Exception):
    """The broker closed the channel or connection instead of confirming."""


class RawPublisher:
    """One connection, one confirm channel; publishes pipelined, waits for the confirms."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._frame_max = 131_072
        self._sent = 0  # delivery tags handed out
        self._confirmed = 0  # highest tag acked (multiple acks cover the ones below)

    @classmethod
    async def connect(
        cls,
        *,
        host: str = "127.0.0.1",
        port: int = 5672,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
    ) -> RawPublisher:
        reader, writer = await within(
            READ_DEADLINE_S,
            f"a TCP connection to {host}:{port}",
            asyncio.open_connection(host, port),
        )
        publisher = cls(reader, writer)
        try:
            await publisher._open(user, password, vhost)
        except BaseException:
            writer.close()
            raise
        return publisher

    @classmethod
    async def connect_url(cls, url: str) -> RawPublisher:
        """`connect` to an `amqp://user:password@host:port/vhost` URL."""
        parts = urlsplit(url)
        return await cls.connect(  # unbounded: its TCP connect and each read have deadlines
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5672,
            user=unquote(parts.username or "guest"),
            password=unquote(parts.password or "guest"),
            vhost=unquote(parts.path[1:]) if len(parts.path) > 1 else "/",
        )

    async def _read(self) -> object:
        async with deadline(READ_DEADLINE_S, "a frame from the broker"):
            head = await self._reader.readexactly(7)
            size = int.from_bytes(head[3:7], "big")
            rest = await self._reader.readexactly(size + 1)
        _, _, value = frame.unmarshal(head + rest)
        if isinstance(value, commands.Channel.Close | commands.Connection.Close):
            raise BrokerRefused(f"{value.reply_code} {value.reply_text}")
        return value

    async def _open(self, user: str, password: str, vhost: str) -> None:
        self._writer.write(b"AMQP\x00\x00\x09\x01")
        await self._read()  # Connection.Start
        start_ok = commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response=f"\0{user}\0{password}"
        )
        self._writer.write(frame.marshal(start_ok, 0))
        tune = await self._read()
        assert isinstance(tune, commands.Connection.Tune)
        self._frame_max = tune.frame_max or self._frame_max
        tune_ok = commands.Connection.TuneOk(
            channel_max=tune.channel_max, frame_max=self._frame_max, heartbeat=0
        )
        self._writer.write(frame.marshal(tune_ok, 0))
        self._writer.write(frame.marshal(commands.Connection.Open(virtual_host=vhost), 0))
        await self._read()  # Connection.OpenOk
        self._writer.write(frame.marshal(commands.Channel.Open(), 1))
        await self._read()  # Channel.OpenOk
        self._writer.write(frame.marshal(commands.Confirm.Select(), 1))
        await self._read()  # Confirm.SelectOk

    def send(self, routing_key: str, body: bytes, properties: RawProperties) -> None:
        """Write one publish (default exchange); `confirm()` waits for the broker."""
        self._writer.write(frame.marshal(commands.Basic.Publish(routing_key=routing_key), 1))
        header = struct.pack(">HHQ", _BASIC_CLASS, 0, len(body)) + encode_properties(properties)
        self._writer.write(_frame(2, 1, header))
        chunk = self._frame_max - 8
        for start in range(0, len(body), chunk):
            self._writer.write(_frame(3, 1, body[start : start + chunk]))
        self._sent += 1

    async def confirm(self) -> None:
        """Wait until the broker confirmed everything sent so far; a nack raises."""
        await within(READ_DEADLINE_S, "the broker to take our frames", self._writer.drain())
        while self._confirmed < self._sent:
            reply = await self._read()
            if isinstance(reply, commands.Basic.Nack):
                raise BrokerRefused(f"nack up to delivery tag {reply.delivery_tag}")
            if isinstance(reply, commands.Basic.Ack):
                self._confirmed = max(self._confirmed, reply.delivery_tag)

    async def publish(self, routing_key: str, body: bytes, properties: RawProperties) -> None:
        """Publish one message and wait for its confirm."""
        self.send(routing_key, body, properties)
        await self.confirm()

    async def close(self) -> None:
        try:
            close = commands.Connection.Close(
                reply_code=200, reply_text="bye", class_id=0, method_id=0
            )
            self._writer.write(frame.marshal(close, 0))
            await asyncio.wait_for(self._writer.drain(), 5)
            await asyncio.wait_for(self._read(), 5)  # Connection.CloseOk
        except (OSError, asyncio.IncompleteReadError, TimeoutError, BrokerRefused):
            pass  # closing anyway
        finally:
            self._writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(self._writer.wait_closed(), 5)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def publish_raw(
    queue: str,
    body: bytes,
    *,
    url: str = "amqp://guest:guest@127.0.0.1:5672/",
    headers: RawTable | None = None,
    properties: RawProperties | None = None,
) -> None:
    """Publish one message to `queue` on a connection of its own (no message_id unless given)."""
    props = properties if properties is not None else RawProperties(headers=headers)
    async with await RawPublisher.connect_url(url) as raw:
        await raw.publish(queue, body, props)  # unbounded: each frame read has its deadline
