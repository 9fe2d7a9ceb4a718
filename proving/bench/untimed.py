"""The `bare` variant: an aio-pika consumer with no instrument, timed by the queue's depth.

The other variants run in the bench process under the stopwatch, which wraps
aio-pika's `IncomingMessage` to time every delivery and ack (about 20 us a
message); an anchor measured that way flatters whatever is measured against
it. `bare` is aio-pika as its documentation shows, in a process of its own
(`proving.bench.plain_consumer`), with no clock inside. From outside:

1. The queue is filled first (the run's backlog, as for every variant).
2. The consumer process starts; the bench reads the queue's depth (a passive
   declare's `message_count`: messages ready, none consumed by reading it)
   every POLL_SECONDS, the whole run bounded by its timeout.
3. The first reading at or below backlog - prefetch is the consumer's start:
   at `started`, `depth` messages were still ready and the prefetch window
   was full (no message leaves the queue any more but for an ack).
4. The first reading of 0 is the queue empty, at `emptied`. In between,
   `depth` messages left the queue, each one let out by an ack (the window
   was full at both ends), so the rate is `depth / (emptied - started)`.
5. The process exits once it has acked every message; the queue, read after
   its connection closed, must still be empty (an unacked message would be
   back), and the process must say it acked them all.

A backlog no larger than the prefetch window leaves the queue in one burst:
no rate (0) from such a run. There is no latency either (p50 and p99 are
NaN): nothing here times a message.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aio_pika

from proving.bench.stopwatch import Timing
from proving.bench.variant import Run, Variant
from proving.deadlines import ANSWER_S, within

POLL_SECONDS = 0.01
EXIT_SECONDS = 30.0  # for the consumer to close once it has acked everything
CONSUMER = Path(__file__).with_name("plain_consumer.py")


class BareRunFailed(Exception):
    """The bare consumer left messages behind or did not say it acked them all."""


async def _depth(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True, timeout=ANSWER_S)
    return declared.declaration_result.message_count or 0


async def _first(
    channel: aio_pika.abc.AbstractChannel, queue: str, until: Callable[[int], bool]
) -> tuple[float, int]:
    """(when, depth) of the first reading of `queue` for which `until(depth)` holds."""
    while True:
        depth = await _depth(channel, queue)
        if until(depth):
            return time.perf_counter(), depth
        await asyncio.sleep(POLL_SECONDS)


def _fields(out: bytes) -> dict[str, str]:
    """`acked=20000 peak_mb=31` as {"acked": "20000", "peak_mb": "31"}."""
    pairs = (field.partition("=") for field in out.decode().split())
    return {key: value for key, _, value in pairs}


async def bare(run: Run) -> Timing:
    queue, total = run.sandbox.queue, run.messages
    full = max(total - run.prefetch, 0)
    end = time.perf_counter() + run.timeout

    def left() -> float:
        return max(0.0, end - time.perf_counter())

    connection = await aio_pika.connect(run.settings.amqp.url, timeout=run.timeout)
    consumer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        str(CONSUMER),
        run.settings.amqp.url,
        queue,
        str(run.prefetch),
        str(total),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        channel = await within(left(), "bare: a channel to read the depth", connection.channel())
        # 2. and 3.: the window full
        started, depth = await within(
            left(),
            f"bare: at most {full} of {total} messages ready in {queue} (the window full)",
            _first(channel, queue, lambda d: d <= full),
        )
        # 4. the queue empty
        emptied, _ = await within(
            left(), f"bare: {queue} empty", _first(channel, queue, lambda d: d == 0)
        )
        # 5. every message acked
        out, _ = await within(
            left() + EXIT_SECONDS,
            f"bare: the plain consumer's exit once {queue} was empty",
            consumer.communicate(),
        )
        back = await within(EXIT_SECONDS, f"bare: the depth of {queue}", _depth(channel, queue))
        said = _fields(out)
        if consumer.returncode != 0 or back or said.get("acked") != str(total):
            raise BareRunFailed(
                f"bare: exit {consumer.returncode}, said {out.decode().strip()!r},"
                f" {back} messages back in the queue, {total} expected acked"
            )
    finally:
        if consumer.returncode is None:
            consumer.kill()
            await within(EXIT_SECONDS, "bare: the killed consumer's exit", consumer.wait())
        await connection.close()
    return Timing(
        messages=depth,
        seconds=emptied - started if depth else 0.0,
        peak_mb=float(said["peak_mb"]),
    )


VARIANTS = (
    Variant(
        name="bare",
        what="aio-pika as documented, its own process, no instrument: timed by the queue's depth",
        consume=bare,
        writes=False,
    ),
)
