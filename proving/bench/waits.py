"""A send's wait for its answer: `asyncio.wait` with a timeout, against `answered_within`.

    python -m proving.bench.waits [--in-flight 2000] [--rounds 7]

`ApnsProvider.send` waits for its stream's answer with a timeout and must not
cancel the answer when the send itself is cancelled. Each round starts
`--in-flight` tasks (the push bench's window), each waiting on its own future
one way, resolves every future, and times the whole from the first task's
start to the last one's end; then the other way, on the same machine a
moment later. `plain` (an `await` with no timeout, which would cancel the
answer) is the floor. The last line gives the medians and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from providers.apns import answered_within

TIMEOUT_S = 10.0  # never reached: every future is resolved at once


async def _asyncio_wait(answer: asyncio.Future[object]) -> None:
    await asyncio.wait((answer,), timeout=TIMEOUT_S)


async def _answered_within(answer: asyncio.Future[object]) -> None:
    await answered_within(answer, TIMEOUT_S)


async def _plain(answer: asyncio.Future[object]) -> None:
    await answer


WAYS: dict[str, Callable[[asyncio.Future[object]], Awaitable[None]]] = {
    "asyncio_wait": _asyncio_wait,
    "answered_within": _answered_within,
    "plain": _plain,
}


async def microseconds_a_wait(way: str, in_flight: int, repeats: int = 20) -> float:
    """The median over `repeats` windows of `in_flight` waits, in us a wait."""
    loop = asyncio.get_running_loop()
    wait = WAYS[way]
    timings = []
    for _ in range(repeats):
        answers: list[asyncio.Future[object]] = [loop.create_future() for _ in range(in_flight)]
        started = time.perf_counter()
        tasks = [asyncio.ensure_future(wait(a)) for a in answers]
        await asyncio.sleep(0)  # every task waiting
        for answer in answers:
            answer.set_result(None)
        await asyncio.gather(*tasks)
        timings.append((time.perf_counter() - started) / in_flight * 1e6)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {way: [] for way in WAYS}
    for round_ in range(1, args.rounds + 1):
        for way in WAYS:
            figures[way].append(asyncio.run(microseconds_a_wait(way, args.in_flight)))
        print(f"round {round_}: " + ", ".join(f"{w} {f[-1]:.2f} µs" for w, f in figures.items()))
    medians = {way: statistics.median(f) for way, f in figures.items()}
    ratio = medians["answered_within"] / medians["asyncio_wait"]
    print(
        f"waits_bench: in_flight={args.in_flight}"
        + "".join(f" {way}_us={us:.2f}" for way, us in medians.items())
        + f" answered_within/asyncio_wait={ratio:.2f}"
    )


if __name__ == "__main__":
    main()
