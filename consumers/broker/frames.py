"""aiormq's frame reader, reading the socket a buffer at a time instead of a frame at a time.

aiormq's `FrameReceiver.get_frame` reads each frame in three awaited
`readexactly` calls (its first byte, the rest of its header, its payload)
into a fresh `BytesIO` under a lock, then hands the bytes to pamqp. A
delivery is three frames (Basic.Deliver, its content header, its body), so
a worker pays that nine times a message before pamqp parses anything.
`python -m proving.bench.frames` times both on the same deliveries in
memory: 14.7 µs a delivery here against aiormq's 22.6 (2026-12-06, the
2-core python-svc machine).

`BufferedFrameReceiver` keeps what one read returned and cuts the frames out
of it: pamqp still reads each frame's header (`frame_parts`) and parses the
frame (`unmarshal`); the rest of a frame cut short by the read is read
exactly (one more copy of the frame, whatever its size, as aiormq's own
`readexactly` makes). It returns what aiormq's reader returns, frame for
frame, and raises what it raises: the end of the stream between frames ends
the iteration; the end inside a frame, or a socket error, is
`AMQPConnectionError`; a frame pamqp refuses is `InvalidFrameError`; a
protocol header where a frame was due (a broker that refused our protocol
version) is `ProtocolSyntaxError`.

aiormq builds its receiver inside `Connection.connect` by its module's name
`FrameReceiver`, and aio-pika opens aiormq's connections itself, so
`install()` puts this class under that name: every aiormq connection the
process opens afterwards reads through it. `consumers.broker.connection`'s
`connect` and `connect_once` install it before they open one.
"""

from __future__ import annotations

import asyncio

import aiormq.connection
import pamqp.frame
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError, ProtocolSyntaxError
from pamqp.constants import FRAME_HEADER_SIZE
from pamqp.exceptions import PAMQPException

READ_BYTES = 256 * 1024  # at most this much taken from the stream per read
FRAME_END_SIZE = 1  # the frame-end octet after a frame's payload
# aiormq's own receiver, taken before install() puts ours under its name: the
# benches and tests compare against it.
AIORMQ_RECEIVER: type[aiormq.connection.FrameReceiver] = aiormq.connection.FrameReceiver


class BufferedFrameReceiver(aiormq.connection.FrameReceiver):
    """aiormq's `FrameReceiver`, its frames cut from one read's bytes (see the module docstring)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        super().__init__(reader)
        self._data = b""  # bytes read and not yet returned as frames start at _at
        self._at = 0

    async def get_frame(self) -> aiormq.connection.ReceivedFrame:
        data, at = self._data, self._at
        while len(data) - at < FRAME_HEADER_SIZE:
            if at == len(data) and self.reader.at_eof():
                raise StopAsyncIteration  # as aiormq's: the stream ended between frames
            data, at = data[at:] + await self._read(READ_BYTES, len(data) - at), 0
            self._data, self._at = data, at  # kept at once: a cancelled wait below loses none
        if not self.started and data.startswith(b"AMQP", at):
            raise ProtocolSyntaxError("Unexpected AMQP protocol header")
        self.started = True
        _, _, size = pamqp.frame.frame_parts(data[at : at + FRAME_HEADER_SIZE])
        end = at + FRAME_HEADER_SIZE + (size or 0) + FRAME_END_SIZE
        if len(data) < end:  # the rest of this frame, exactly: one copy, however large
            held = len(data) - at
            data = data[at:] + await self._read(end - len(data), held, exactly=True)
            at, end = 0, end - at
        self._data, self._at = data, end
        try:
            return pamqp.frame.unmarshal(data[at:end])
        except PAMQPException as exc:
            raise InvalidFrameError(str(exc)) from exc

    async def _read(self, size: int, held: int, *, exactly: bool = False) -> bytes:
        """The next bytes of the stream: up to `size`, or `exactly` that many.

        The stream's end raises, as aiormq's words it (`held`: the bytes of the
        frame read before it), and so does a socket error.
        """
        try:
            if exactly:
                return await self.reader.readexactly(size)
            chunk = await self.reader.read(size)
        except asyncio.IncompleteReadError as exc:
            held += len(exc.partial)
            chunk = b""
        except ConnectionRefusedError as exc:
            raise AMQPConnectionError(f"Server connection refused: {exc!r}") from exc
        except ConnectionResetError as exc:
            raise AMQPConnectionError(f"Server connection reset: {exc!r}") from exc
        except ConnectionError as exc:
            raise AMQPConnectionError(f"Server connection error: {exc!r}") from exc
        except OSError as exc:
            raise AMQPConnectionError(f"Server communication error: {exc!r}") from exc
        if not chunk:
            raise AMQPConnectionError(
                f"Server connection unexpectedly closed. Read {held} bytes of a frame"
            )
        return chunk


def install() -> None:
    """Every aiormq connection opened from now on reads through `BufferedFrameReceiver`."""
    aiormq.connection.FrameReceiver = BufferedFrameReceiver  # type: ignore[misc]
