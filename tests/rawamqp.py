"""Publish an AMQP message exactly as given, with no client filling in properties.

aiormq (under aio-pika) gives every published message without a `message_id`
a random one, so a test cannot send the "missing message_id" bad input through
it. Other clients do send such messages; this speaks just enough AMQP 0-9-1
(with pamqp, which aiormq already depends on) to publish one.
"""

from __future__ import annotations

import asyncio

from pamqp import commands, frame, header
from pamqp import heartbeat as _heartbeat  # noqa: F401 - registers the frame type
from pamqp.body import ContentBody
from pamqp.common import FieldTable


async def _read_frame(reader: asyncio.StreamReader) -> object:
    head = await reader.readexactly(7)
    size = int.from_bytes(head[3:7], "big")
    rest = await reader.readexactly(size + 1)
    _, _, value = frame.unmarshal(head + rest)
    return value


async def publish_raw(
    queue: str,
    body: bytes,
    *,
    host: str = "127.0.0.1",
    port: int = 5672,
    user: str = "guest",
    password: str = "guest",
    headers: FieldTable | None = None,
) -> None:
    """Publish `body` to `queue` (default exchange) with no message_id, confirmed."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"AMQP\x00\x00\x09\x01")
        await _read_frame(reader)  # Connection.Start
        writer.write(
            frame.marshal(
                commands.Connection.StartOk(
                    client_properties={},
                    mechanism="PLAIN",
                    response=f"\0{user}\0{password}",
                ),
                0,
            )
        )
        tune = await _read_frame(reader)
        assert isinstance(tune, commands.Connection.Tune)
        writer.write(
            frame.marshal(
                commands.Connection.TuneOk(
                    channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
                ),
                0,
            )
        )
        writer.write(frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
        await _read_frame(reader)  # Connection.OpenOk
        writer.write(frame.marshal(commands.Channel.Open(), 1))
        await _read_frame(reader)  # Channel.OpenOk
        writer.write(frame.marshal(commands.Confirm.Select(), 1))
        await _read_frame(reader)  # Confirm.SelectOk
        properties = commands.Basic.Properties(delivery_mode=2, headers=headers)
        writer.write(frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1))
        writer.write(frame.marshal(header.ContentHeader(0, len(body), properties), 1))
        writer.write(frame.marshal(ContentBody(body), 1))
        await writer.drain()
        ack = await _read_frame(reader)
        assert isinstance(ack, commands.Basic.Ack), ack
        writer.write(
            frame.marshal(
                commands.Connection.Close(
                    reply_code=200, reply_text="bye", class_id=0, method_id=0
                ),
                0,
            )
        )
        await writer.drain()
        await _read_frame(reader)  # Connection.CloseOk
    finally:
        writer.close()
        await writer.wait_closed()
