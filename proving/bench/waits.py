"""A send's wait for its answer: `asyncio.wait` with a timeout, against `AnswerWaits`.

    python -m proving.bench.waits [--in-flight 2000] [--rounds 7]

`ApnsProvider.send` waits for its stream's answer with a timeout and must not
cancel the answer when the send itself is cancelled. Each round starts
`--in-flight` tasks (the push bench's window), each waiting on its own
stream's answer one way, answers every stream, and times the whole from the
first task's start to the last one's end; then each other way, on the same
machine a moment later. `asyncio_wait`: `asyncio.wait((answer,), timeout=...)`,
what `ApnsProvider.send` did before 2026-12-06; `timer_each`: one future and
one timer per wait; `answer_waits`: `providers.apns_wire.AnswerWaits`, one
timer per connection. `plain` (an `await` with no timeout, which would cancel
the answer) is the floor. The last line gives the medians and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from providers.apns_wire import AnswerWaits, Lost, Outcome, PendingStream

TIMEOUT_S = 10.0  # never reached: every future is resolved at once


async def _timer_each(answer: asyncio.Future[Outcome], seconds: float) -> bool:
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    answer.add_done_callback(wake)
    timer = loop.call_later(seconds, wake)
    try:
        await waiter  # unbounded: the timer above ends it (the way measured)
    finally:
        timer.cancel()
        answer.remove_done_callback(wake)
    return answer.done()


async def _wait(way: str, waits: AnswerWaits, stream: PendingStream) -> None:
    if way == "asyncio_wait":
        await asyncio.wait((stream.answer,), timeout=TIMEOUT_S)
    elif way == "timer_each":
        await _timer_each(stream.answer, TIMEOUT_S)
    elif way == "answer_waits":
        await waits.wait(stream)  # unbounded: the stream's deadline ends it (the way measured)
    else:  # unbounded: the floor measured; the bench answers every stream a step later
        await stream.answer


async def microseconds_a_wait(way: str, in_flight: int, repeats: int = 20) -> float:
    """The median over `repeats` windows of `in_flight` waits, in us a wait."""
    loop = asyncio.get_running_loop()
    timings = []
    for _ in range(repeats):
        streams = {
            n: PendingStream(answer=loop.create_future(), deadline=loop.time() + TIMEOUT_S)
            for n in range(in_flight)
        }
        waits = AnswerWaits(loop, streams.values)
        started = time.perf_counter()
        tasks = [asyncio.ensure_future(_wait(way, waits, s)) for s in streams.values()]
        await asyncio.sleep(0)  # every task waiting
        for n in range(in_flight):  # as the connection finishes each
            stream = streams.pop(n)
            stream.answer.set_result(Lost(reason="bench"))
            waits.answered(stream)
        await asyncio.gather(*tasks)
        timings.append((time.perf_counter() - started) / in_flight * 1e6)
        waits.close()
    return statistics.median(timings)


WAYS = ("asyncio_wait", "timer_each", "answer_waits", "plain")


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
    ratio = medians["answer_waits"] / medians["asyncio_wait"]
    print(
        f"waits_bench: in_flight={args.in_flight}"
        + "".join(f" {way}_us={us:.2f}" for way, us in medians.items())
        + f" answer_waits/asyncio_wait={ratio:.2f}"
    )


if __name__ == "__main__":
    main()
