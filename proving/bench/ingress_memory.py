"""The memory `serve` holds under oversized requests: 100 uploads of 100 MB at once, a 32 MB header.

    python -m proving.bench.ingress_memory [--uploads 100] [--upload-mb 100] [--header-mb 32]
        [--cap-mb 2048] [--seconds 60]

Starts `serve` on a free loopback port over a fresh schema (dropped after)
and samples its resident memory from /proc every 20 ms while:
- uploads: that many connections at once, each announcing `--upload-mb` of
  body (Content-Length) and sending it as fast as the server reads, until
  the server answers or the whole body is sent;
- header: one connection sending one header line of `--header-mb`.
Bounded: loopback only; serve is killed once its memory passes `--cap-mb`
or after `--seconds` a phase, and the line says so. One line a phase: peak
RSS over the idle RSS, seconds, answers by status.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from consumers import Settings
from dedupe import migrate, quote_ident
from ingress.keys import ApiKeys
from proving.deadlines import ANSWER_S, deadline

PIECE = b"x" * 65536
# One request's answer, its body sent over loopback: far above what 100 MB takes.
REQUEST_S = 600.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """serve says it listens once its socket is bound, a moment before it accepts."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), ANSWER_S)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def _status(reader: asyncio.StreamReader) -> int:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_S)
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        return 0
    return int(head[9:12])


async def upload(port: int, key: str, size: int) -> int:
    """One request announcing `size` bytes of body, sent until the server answers."""
    async with deadline(REQUEST_S, f"an upload of {size} bytes answered"):
        return await _upload(port, key, size)


async def _upload(port: int, key: str, size: int) -> int:
    reader, writer = await connect(port)  # unbounded: upload() bounds the request
    writer.write(
        f"POST /v1/messages HTTP/1.1\r\nHost: m\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nIdempotency-Key: m\r\n"
        f"Content-Length: {size}\r\n\r\n".encode()
    )
    answer = asyncio.create_task(_status(reader))
    sent = 0
    try:
        while sent < size and not answer.done():
            writer.write(PIECE[: size - sent])
            sent += min(len(PIECE), size - sent)
            await writer.drain()  # unbounded: upload() bounds the request
    except ConnectionError:
        pass
    status = await answer  # unbounded: _status has its own deadline
    writer.close()
    return status


async def header_flood(port: int, size: int) -> int:
    async with deadline(REQUEST_S, f"a header of {size} bytes answered"):
        return await _header_flood(port, size)


async def _header_flood(port: int, size: int) -> int:
    reader, writer = await connect(port)  # unbounded: header_flood() bounds the request
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: m\r\nX-Flood: ")
    answer = asyncio.create_task(_status(reader))
    sent = 0
    try:
        while sent < size and not answer.done():
            writer.write(PIECE)
            sent += len(PIECE)
            await writer.drain()  # unbounded: header_flood() bounds the request
        if not answer.done():
            writer.write(b"\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()  # unbounded: as above
    except ConnectionError:
        pass
    status = await answer  # unbounded: _status has its own deadline
    writer.close()
    return status


async def phase(
    name: str, pid: int, work: Sequence[asyncio.Future[int]], cap: float, seconds: float
) -> str:
    idle, peak = rss_mb(pid), 0.0
    started = time.monotonic()
    gathered = asyncio.gather(*work, return_exceptions=True)
    verdict = "done"
    while not gathered.done():
        peak = max(peak, rss_mb(pid))
        if peak > cap:
            verdict = f"stopped: serve passed {cap:.0f} MB"
            os.kill(pid, signal.SIGKILL)
            break
        if time.monotonic() - started > seconds:
            verdict = f"stopped: not done within {seconds:.0f} s"
            break
        await asyncio.sleep(0.02)
    took = time.monotonic() - started
    if not gathered.done():
        gathered.cancel()
    results = await asyncio.gather(gathered, return_exceptions=True)
    answers = results[0] if isinstance(results[0], list) else [results[0]]
    statuses = Counter(r if isinstance(r, int) else type(r).__name__ for r in answers)
    return (
        f"ingress_memory: {name} idle_rss_mb={idle:.0f} peak_rss_mb={peak:.0f}"
        f" seconds={took:.1f} statuses={dict(statuses)} {verdict}"
    )


def start_serve(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], int]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "consumers", "serve", "--host", "127.0.0.1", "--port", "0"],
            env=env,
            stdout=out,
            stderr=out,
        )
    deadline = time.monotonic() + 60
    while not (found := re.search(r"listening on http://127.0.0.1:(\d+)", log.read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"serve did not listen: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, int(found[1])


async def _db(url: str, schema: str, create: bool) -> str:
    conn = await asyncpg.connect(url, timeout=ANSWER_S)
    try:
        if not create:
            await conn.execute(
                f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S
            )
            return ""
        await migrate(conn, schema)
        return await ApiKeys(schema).create(conn, "memory")
    finally:
        await conn.close()


async def measure(args: argparse.Namespace, env: dict[str, str], key: str, log: Path) -> None:
    for name in ("uploads", "header"):
        proc, port = start_serve(env, log.with_name(f"serve-{name}.log"))
        try:
            if name == "uploads":
                work = [
                    asyncio.ensure_future(upload(port, key, args.upload_mb * 1_048_576))
                    for _ in range(args.uploads)
                ]
                label = f"uploads={args.uploads}x{args.upload_mb}MB"
            else:
                work = [asyncio.ensure_future(header_flood(port, args.header_mb * 1_048_576))]
                label = f"header={args.header_mb}MB"
            print(await phase(label, proc.pid, work, args.cap_mb, args.seconds), flush=True)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.ingress_memory")
    parser.add_argument("--uploads", type=int, default=100)
    parser.add_argument("--upload-mb", type=int, default=100)
    parser.add_argument("--header-mb", type=int, default=32)
    parser.add_argument("--cap-mb", type=float, default=2048)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args(argv)
    url = Settings.from_env().database.url
    schema = f"bench_memory_{uuid.uuid4().hex[:8]}"
    key = asyncio.run(_db(url, schema, create=True))
    env = {**os.environ, "DATABASE_URL": url, "DATABASE_SCHEMA": schema}
    log = Path(tempfile.mkdtemp(prefix="iw-ingress-memory-")) / "serve.log"
    try:
        asyncio.run(measure(args, env, key, log))
    finally:
        asyncio.run(_db(url, schema, create=False))
    print(f"ingress_memory: load average {os.getloadavg()[0]:.2f}, cores={os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
