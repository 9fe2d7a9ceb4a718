"""aiormq's frames read a buffer at a time (`consumers.broker.frames`): its frames, its errors."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aio_pika
import aiormq.connection
import pamqp.frame
import pytest
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError, ProtocolSyntaxError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.common import FieldTable
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

from consumers.broker.connection import connect
from consumers.broker.frames import AIORMQ_RECEIVER, READ_BYTES, BufferedFrameReceiver
from proving.deadlines import ANSWER_S, within
from tests.conftest import AMQP_URL


def test_aiormqs_own_receiver_is_kept_apart_from_ours() -> None:
    assert AIORMQ_RECEIVER.__module__ == "aiormq.connection"
    assert AIORMQ_RECEIVER is not BufferedFrameReceiver
    assert issubclass(BufferedFrameReceiver, AIORMQ_RECEIVER)


def _delivery(tag: int, body: bytes, headers: FieldTable) -> list[bytes]:
    """The frames of one delivery on channel 1, as a broker sends them (no body frame for b"")."""
    properties = commands.Basic.Properties(
        message_id=f"m-{tag}", content_type="application/json", headers=headers
    )
    frames = [
        pamqp.frame.marshal(commands.Basic.Deliver("ctag", tag, False, "", "q"), 1),
        pamqp.frame.marshal(ContentHeader(0, len(body), properties), 1),
    ]
    return [*frames, pamqp.frame.marshal(ContentBody(body), 1)] if body else frames


def _stream(bodies: list[bytes]) -> bytes:
    frames = [pamqp.frame.marshal(Heartbeat(), 0)]
    for tag, body in enumerate(bodies, start=1):
        frames += _delivery(tag, body, {"x-tenant": "tenant-é", "n": tag})
    return b"".join(frames)


Read = list[tuple[int, int, bytes]]


async def _read_all(receiver: aiormq.connection.FrameReceiver) -> tuple[Read, BaseException | None]:
    """Every frame (its weight, channel, bytes as pamqp marshals it) and what ended the reading.

    The end of the stream ends it cleanly (None) when it was seen before a frame
    was asked for, and as `AMQPConnectionError` when it came during the wait for
    one: aiormq's own receiver does both, by when the end arrives.
    """
    read = []
    try:
        async for weight, channel, frame in receiver:
            read.append((weight, channel, pamqp.frame.marshal(frame, channel)))
    except AMQPConnectionError as exc:
        return read, exc
    return read, None


async def _frames_of(
    receiver_class: type[aiormq.connection.FrameReceiver], pieces: list[bytes]
) -> Read:
    """What `receiver_class` reads from a stream fed `pieces` one by one, each after a pause."""
    reader = asyncio.StreamReader()

    async def feed() -> None:
        for piece in pieces:
            reader.feed_data(piece)
            await asyncio.sleep(0)  # the receiver reads what came so far, and waits
        reader.feed_eof()

    feeding = asyncio.create_task(feed())
    frames, ended = await within(
        ANSWER_S, "the frames of the stream", _read_all(receiver_class(reader))
    )
    await feeding
    assert ended is None or "Read 0 bytes" in str(ended)
    return frames


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_any_split_of_a_stream_gives_aiormqs_own_frames(
    bodies: list[bytes], cuts: list[int]
) -> None:
    data = _stream(bodies)
    pieces = _split(data, cuts)
    ours = asyncio.run(_frames_of(BufferedFrameReceiver, pieces))
    theirs = asyncio.run(_frames_of(AIORMQ_RECEIVER, pieces))
    assert ours == theirs
    assert len(ours) == 1 + sum(3 if body else 2 for body in bodies)
    assert b"".join(frame for _, _, frame in ours) == data


@pytest.mark.parametrize("piece", [None, 65_536, 1_000], ids=["whole", "64k-pieces", "1k-pieces"])
def test_a_body_longer_than_one_read_is_one_frame(piece: int | None) -> None:
    body = bytes(range(256)) * (READ_BYTES // 256 + 300)
    data = _stream([body])
    pieces = [data] if piece is None else _split(data, list(range(0, len(data), piece)))
    frames = asyncio.run(_frames_of(BufferedFrameReceiver, pieces))
    assert frames[-1][2] == pamqp.frame.marshal(ContentBody(body), 1)


ServerWrites = Callable[[asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _receiver_of(writes: ServerWrites) -> AsyncIterator[BufferedFrameReceiver]:
    """A receiver on a real TCP connection to a server that writes `writes`, then closes."""

    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await writes(writer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield BufferedFrameReceiver(reader)
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def _outcome(writes: ServerWrites) -> tuple[list[bytes], BaseException | None]:
    """The frames read from such a server, and what ended the reading (None: the stream's end)."""
    read: list[bytes] = []
    async with _receiver_of(writes) as receiver:
        try:
            while True:
                _, channel, frame = await within(ANSWER_S, "a frame", receiver.get_frame())
                read.append(pamqp.frame.marshal(frame, channel))
        except StopAsyncIteration:
            return read, None
        except Exception as exc:
            return read, exc


def _writing(*chunks: bytes) -> ServerWrites:
    async def writes(writer: asyncio.StreamWriter) -> None:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()

    return writes


async def test_the_stream_ending_between_frames_ends_the_reading() -> None:
    frames = _delivery(1, b"body", {})
    read, ended = await _outcome(_writing(b"".join(frames)))
    assert read == frames
    # Seen before the next frame was asked for, or while it was awaited (as aiormq's own).
    assert ended is None or (
        isinstance(ended, AMQPConnectionError) and "Read 0 bytes" in str(ended)
    )


@pytest.mark.parametrize("held", [5, 10], ids=["in-its-header", "in-its-payload"])
async def test_the_stream_ending_inside_a_frame_is_a_connection_error(held: int) -> None:
    frames = _delivery(1, b"body", {})
    read, ended = await _outcome(_writing(frames[0], frames[1][:held]))
    assert read == frames[:1]
    assert isinstance(ended, AMQPConnectionError)
    assert f"unexpectedly closed. Read {held} bytes" in str(ended)


async def test_a_frame_without_its_end_octet_is_an_invalid_frame() -> None:
    good = _delivery(1, b"body", {})[0]
    read, ended = await _outcome(_writing(good[:-1] + b"\x00"))
    assert read == []
    assert isinstance(ended, InvalidFrameError)


async def test_a_protocol_header_where_the_first_frame_is_due_is_refused() -> None:
    read, ended = await _outcome(_writing(ProtocolHeader(0, 9, 1).marshal()))
    assert read == []
    assert isinstance(ended, ProtocolSyntaxError)


async def test_the_workers_connection_reads_through_it_bodies_longer_than_a_frame_and_a_read(
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    connection = await within(ANSWER_S, "a worker's connection", connect([AMQP_URL], name="frames"))
    try:
        transport = connection.transport
        assert transport is not None
        reading = transport.connection._reader_task.get_coro()  # type: ignore[attr-defined]
        assert isinstance(reading.cr_frame.f_locals["frame_receiver"], BufferedFrameReceiver)

        sizes = [0, 1, 131_063, 131_064, 131_065, READ_BYTES + 7, 3 * READ_BYTES]
        bodies = [bytes([n % 251]) * n for n in sizes]
        queue_name = f"test.frames.{uuid.uuid4().hex[:12]}"
        queue = await channel.declare_queue(queue_name, auto_delete=True)
        for n, body in enumerate(bodies):
            headers: FieldTable = {"x-key": f"clé-{n}", "n": n}
            await channel.default_exchange.publish(
                aio_pika.Message(body, headers=headers), routing_key=queue.name
            )

        consuming = await connection.channel()
        got: list[tuple[bytes, object]] = []

        async def consume() -> None:
            async with (await consuming.get_queue(queue.name)).iterator() as messages:
                async for message in messages:
                    await message.ack()
                    got.append((message.body, message.headers["x-key"]))
                    if len(got) == len(bodies):
                        return

        await within(ANSWER_S, "every body back", consume())
        assert got == [(body, f"clé-{n}") for n, body in enumerate(bodies)]
    finally:
        await connection.close()


class _CountedReads(asyncio.StreamReader):
    """A stream that says how many reads were asked of it."""

    reads = 0

    async def read(self, n: int = -1) -> bytes:
        self.reads += 1
        return await super().read(n)


async def test_a_read_cancelled_mid_frame_loses_none_of_its_bytes() -> None:
    frame = _delivery(1, b"body", {})[0]
    reader = _CountedReads()
    receiver = BufferedFrameReceiver(reader)
    reader.feed_data(frame[:3])  # read, then the wait for the rest of the header
    waiting = asyncio.create_task(receiver.get_frame())
    async with asyncio.timeout(ANSWER_S):
        while reader.reads < 2:  # until it waits in its second read
            await asyncio.sleep(0)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    reader.feed_data(frame[3:])
    _, channel, read = await within(ANSWER_S, "the frame", receiver.get_frame())
    assert pamqp.frame.marshal(read, channel) == frame
