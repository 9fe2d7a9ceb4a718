"""aiormq's frame reader against ours (`consumers.broker.frames`), on the same bytes in memory.

    python -m proving.bench.frames [--deliveries 20000] [--rounds 5]

The stream is what a broker sends a consumer: per delivery a Basic.Deliver,
its content header (a message id, a content type, two headers) and a 120-byte
body, each frame marshalled by pamqp, fed to an `asyncio.StreamReader` in
64 KiB pieces as a socket's reads would come. Each round times both
receivers reading every frame, in turn, so both see the same machine; the
last line gives the medians and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import pamqp.frame
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from consumers.broker.frames import AIORMQ_RECEIVER, BufferedFrameReceiver

PIECE_BYTES = 64 * 1024
BODY = b"x" * 120


def stream(deliveries: int) -> bytes:
    frames = []
    for tag in range(1, deliveries + 1):
        properties = commands.Basic.Properties(
            message_id=f"m-{tag}",
            content_type="application/json",
            headers={"x-tenant": "acme", "x-attempt": 1},
        )
        frames.append(pamqp.frame.marshal(commands.Basic.Deliver("ctag", tag, False, "", "q"), 1))
        frames.append(pamqp.frame.marshal(ContentHeader(0, len(BODY), properties), 1))
        frames.append(pamqp.frame.marshal(ContentBody(BODY), 1))
    return b"".join(frames)


async def microseconds_a_delivery(receiver_class: type, data: bytes, deliveries: int) -> float:
    reader = asyncio.StreamReader(limit=len(data) + 1)
    for at in range(0, len(data), PIECE_BYTES):
        reader.feed_data(data[at : at + PIECE_BYTES])
    reader.feed_eof()
    receiver = receiver_class(reader)
    frames = 3 * deliveries
    started = time.perf_counter()
    for _ in range(frames):
        await receiver.get_frame()
    return (time.perf_counter() - started) / deliveries * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    data = stream(args.deliveries)
    theirs, ours = [], []
    for round_ in range(1, args.rounds + 1):
        theirs.append(asyncio.run(microseconds_a_delivery(AIORMQ_RECEIVER, data, args.deliveries)))
        ours.append(
            asyncio.run(microseconds_a_delivery(BufferedFrameReceiver, data, args.deliveries))
        )
        print(f"round {round_}: aiormq {theirs[-1]:.2f} µs a delivery, ours {ours[-1]:.2f}")
    aiormq_us, ours_us = statistics.median(theirs), statistics.median(ours)
    print(
        f"frames_bench: deliveries={args.deliveries} aiormq_us={aiormq_us:.2f}"
        f" ours_us={ours_us:.2f} ours/aiormq={ours_us / aiormq_us:.2f}"
    )


if __name__ == "__main__":
    main()
