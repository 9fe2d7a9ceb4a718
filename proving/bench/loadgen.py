"""An HTTP/1.1 load generator for the ingress bench, run as its own process.

    python -m proving.bench.loadgen '{"url": ..., "mode": "closed", ...}'

Keep-alive connections written to with raw asyncio streams (uvloop when
installed): the generator costs a fraction of what the server it loads does,
so the server, not the generator, is what saturates. Two modes:

- closed: `connections` loops, each sending its next request when the last
  answer came: the server's highest rate;
- open: requests start on a fixed schedule (`rate` per second) whatever the
  answers do; a request's latency counts from its scheduled start, so a
  stall shows in the tail instead of slowing the schedule (no coordinated
  omission).

Requests: `kind` new (a key never used before: `{prefix}-{n}`), replay (keys
`{prefix}-0 .. {replay_keys - 1}`, sent before with the same body) or
trivial (the bench endpoint). Prints one JSON line: counts by status, rate,
p50 and p99 in milliseconds, and the CPU seconds the generator itself used.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from proving.deadlines import ANSWER_S

BODY = json.dumps(
    {
        "targets": [{"platform": "ios", "token": "bench-device-token-0001"}],
        "notification": {"title": "Shipped", "body": "On its way", "data": {"order": "1042"}},
    },
    separators=(",", ":"),
).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    url: str
    key: str
    mode: str  # closed | open
    kind: str  # new | replay | trivial
    seconds: float
    connections: int = 64
    rate: float = 0.0  # open mode: requests per second
    prefix: str = "k"
    replay_keys: int = 1000


def request_bytes(load: Load, n: int, host: str) -> bytes:
    path = "/bench/trivial" if load.kind == "trivial" else "/v1/messages"
    key = f"{load.prefix}-{n % load.replay_keys if load.kind == 'replay' else n}"
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {load.key}\r\n"
        f"Content-Type: application/json\r\nIdempotency-Key: {key}\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def call(self, request: bytes) -> int:
        self.writer.write(request)
        # unbounded: the measured path (a deadline per request would be measured too)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)  # unbounded: as above
        return status


async def run(load: Load) -> dict[str, Any]:
    parts = urlsplit(load.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    connections = [
        Connection(*await asyncio.wait_for(asyncio.open_connection(host, port), ANSWER_S))
        for _ in range(load.connections)
    ]
    statuses: dict[int, int] = {}
    latencies: list[float] = []
    errors = 0
    counter = iter(range(10**12))
    cpu_start = time.process_time()
    start = time.perf_counter()
    stop_at = start + load.seconds

    async def timed(conn: Connection, scheduled: float) -> None:
        nonlocal errors
        try:
            status = await conn.call(request_bytes(load, next(counter), host))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            errors += 1
            return
        latencies.append(time.perf_counter() - scheduled)
        statuses[status] = statuses.get(status, 0) + 1

    if load.mode == "closed":

        async def loop(conn: Connection) -> None:
            while time.perf_counter() < stop_at:
                await timed(conn, time.perf_counter())

        await asyncio.gather(*(loop(c) for c in connections))
    else:
        free: asyncio.Queue[Connection] = asyncio.Queue()
        for conn in connections:
            free.put_nowait(conn)
        tasks: set[asyncio.Task[None]] = set()

        async def scheduled_call(at: float) -> None:
            conn = await free.get()  # unbounded: back as a send ends (latency)
            try:
                await timed(conn, at)
            finally:
                free.put_nowait(conn)

        n = 0
        while True:
            at = start + n / load.rate
            if at >= stop_at:
                break
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(scheduled_call(at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    for conn in connections:
        conn.writer.close()
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2)

    done = sum(statuses.values())
    return {
        "kind": load.kind,
        "mode": load.mode,
        "requests": done,
        "errors": errors,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": round(elapsed, 3),
        "rate": round(done / elapsed, 1),
        "p50_ms": pct(0.50) if latencies else None,
        "p99_ms": pct(0.99) if latencies else None,
        "cpu_seconds": round(cpu_seconds, 3),  # the generator's own, over those seconds
    }


def main() -> None:
    load = Load(**json.loads(sys.argv[1]))
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(run(load))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result = runner.run(run(load))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
