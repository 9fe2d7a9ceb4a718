"""The sending side's figures: the publisher, one confirm at a time or pipelined, and the relay.

    publisher_each       `await publisher.publish(...)` for each job in turn: one
                         confirm (a round trip and the broker's fsync) at a time;
                         --slow-messages jobs a run
    publisher_pipelined  `publisher.publish_many(jobs)`: the window full of
                         publishes in flight, each resolving on its own confirm
    relay                N rows enqueued in one committed transaction, then
                         `idempotent-workers relay` (its own process, started
                         before) publishes them: N / (last row marked published,
                         which is after its confirm - the commit)
    paced relay          rows committed at half the relay's rate for
                         --paced-seconds, in small transactions from 4
                         connections: per row, from its transaction's commit to
                         its mark (after the broker's confirm); p50 and p99

The publishers run in the bench process, on one robust connection. Every job
is the consumer bench's ~300-byte persistent JSON, sent to one queue of the
sandbox's queue type (quorum by default), purged between runs. Runs are
interleaved (each, pipelined, relay) and repeated; figures are medians. The
commit is stamped by PostgreSQL's clock and the mark too, on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aio_pika
import asyncpg

from consumers import Job, Publisher, Settings
from dedupe import quote_ident
from proving.bench.options import SENDING_VARIANTS, BenchOptions
from proving.bench.rounds import say, since
from proving.bench.sandbox import Sandbox
from proving.bench.stopwatch import quantile
from proving.bench.workload import job
from proving.deadlines import ANSWER_S, within

PACED_CONNECTIONS = 4
PACED_TX_PER_SECOND = 200  # transactions a second at most; rows per transaction grow past it


@dataclass(frozen=True, slots=True, kw_only=True)
class Paced:
    rate: float  # rows per second asked for
    rows: int
    p50_ms: float
    p99_ms: float


def _jobs(queue: str, count: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for n in range(count):
        message = job(n, rng)
        jobs.append(Job(queue=queue, body=message.body, message_id=message.message_id or str(n)))
    return jobs


class SendingBench:
    """The target queue, the relay process and the runs made with them."""

    def __init__(
        self,
        *,
        options: BenchOptions,
        settings: Settings,
        sandbox: Sandbox,
        admin: asyncpg.Connection[asyncpg.Record],
        channel: aio_pika.abc.AbstractChannel,
        started: float,
    ) -> None:
        self.options = options
        self.started = started  # time.monotonic() when the bench began
        self.settings = settings  # pointing at the sandbox schema
        self.sandbox = sandbox
        self.admin = admin
        self.channel = channel
        self.queue = f"{sandbox.queue}.sent"
        self.table = f"{quote_ident(sandbox.schema)}.outbox"
        self.body = job(0, random.Random(0)).body
        self.wrong: list[str] = []

    async def run(self, names: Sequence[str]) -> None:
        await self.channel.declare_queue(
            self.queue,
            durable=True,
            arguments={"x-queue-type": str(self.settings.amqp.queue_type)},
            timeout=ANSWER_S,
        )
        publisher, connection = await within(
            ANSWER_S, "a publisher's connection", Publisher.connect(self.settings.amqp.url)
        )
        relay = self._start_relay() if "relay" in names else None
        rates: dict[str, list[float]] = {name: [] for name in names}
        try:
            if relay is not None:
                await self._relay_ready()
            n, slow = self.options.messages, self.options.slow_messages
            for r in range(self.options.repeats):
                if "publisher_each" in names:
                    rate = await self._each(publisher, slow, seed=r)
                    rates["publisher_each"].append(self._shown("publisher_each", r, slow, rate))
                if "publisher_pipelined" in names:
                    rate = await self._pipelined(publisher, n, seed=r)
                    rates["publisher_pipelined"].append(
                        self._shown("publisher_pipelined", r, n, rate)
                    )
                if relay is not None:
                    rate = await self._relay_run(n, tag=f"r{r}")
                    rates["relay"].append(self._shown("relay", r, n, rate))
            medians = {name: statistics.median(v) for name, v in rates.items() if v}
            for name, rate in medians.items():
                runs = ", ".join(f"{x:,.0f}" for x in rates[name])
                say(f"sending: {name:<20} {rate:>9,.0f} msg/s  (runs: {runs})")
            paced = None
            if relay is not None and self.options.paced_seconds > 0:
                paced = await self._paced(medians["relay"] / 2, self.options.paced_seconds)
            say(_summary(medians, paced))
        finally:
            await connection.close()
            if relay is not None:
                relay.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(relay.wait, 60)
                except subprocess.TimeoutExpired:
                    relay.kill()
                    relay.wait()
            await self.channel.queue_delete(self.queue, timeout=ANSWER_S)

    def _shown(self, name: str, r: int, n: int, rate: float) -> float:
        """`rate`, once the progress line of run `r` of `name` is out."""
        say(
            f"sending {name:<20} {r + 1}/{self.options.repeats} {n:>7,} msgs {rate:>8,.0f} msg/s"
            f"  at {since(self.started)}"
        )
        return rate

    async def _expect_queued(self, count: int, what: str) -> None:
        """Every job confirmed is in the queue; then empty it for the next run."""
        declared = await self.channel.declare_queue(self.queue, passive=True, timeout=ANSWER_S)
        got = declared.declaration_result.message_count or 0
        if got != count:
            self.wrong.append(f"{what}: {got} messages in the queue, expected {count}")
        await self._purge()

    async def _purge(self) -> None:
        queue = await self.channel.declare_queue(self.queue, passive=True, timeout=ANSWER_S)
        await queue.purge(timeout=ANSWER_S)

    async def _each(self, publisher: Publisher, n: int, *, seed: int) -> float:
        jobs = _jobs(self.queue, n, seed)
        started = time.perf_counter()
        for j in jobs:
            await publisher.publish(j.queue, j.body, message_id=j.message_id)  # unbounded: measured
        rate = n / (time.perf_counter() - started)
        await self._expect_queued(n, "publisher_each")
        return rate

    async def _pipelined(self, publisher: Publisher, n: int, *, seed: int) -> float:
        jobs = _jobs(self.queue, n, seed)
        started = time.perf_counter()
        errors = await publisher.publish_many(jobs)
        rate = n / (time.perf_counter() - started)
        if any(errors):
            self.wrong.append(f"publisher_pipelined: {sum(map(bool, errors))} not confirmed")
        await self._expect_queued(n, "publisher_pipelined")
        return rate

    # -- the relay, in a process of its own ---------------------------------

    def _start_relay(self) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "AMQP_URL": ",".join(self.settings.amqp.urls),
            "DATABASE_URL": self.settings.database.url,
            "DATABASE_SCHEMA": self.sandbox.schema,
        }
        with open(self.options.log_file, "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "consumers", "relay"], env=env, stdout=log, stderr=log
            )

    async def _enqueue(
        self, conn: asyncpg.Connection[asyncpg.Record], prefix: str, rows: int
    ) -> float:
        """`rows` rows in one transaction; the epoch second just before its COMMIT."""
        async with conn.transaction():
            await conn.execute(
                f"INSERT INTO {self.table} (queue, tenant, message_id, body)"
                " SELECT $1, '', $2 || g, $3 FROM generate_series(1, $4) g",
                self.queue,
                prefix,
                self.body,
                rows,
                timeout=ANSWER_S,
            )
            stamp: float = await conn.fetchval(
                "SELECT extract(epoch FROM clock_timestamp())::float8",
                timeout=ANSWER_S,
            )
        return stamp

    async def _wait_published(self, prefix: str, rows: int) -> None:
        deadline = time.monotonic() + self.options.timeout
        while time.monotonic() < deadline:
            pending = await self.admin.fetchval(
                f"SELECT count(*) FROM {self.table}"
                " WHERE published_at IS NULL AND message_id LIKE $1 || '%'",
                prefix,
                timeout=ANSWER_S,
            )
            if pending == 0:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError(f"relay: rows {prefix}* not all published in {self.options.timeout} s")

    async def _relay_ready(self) -> None:
        """One row through the relay: it is up, connected and listening."""
        await self._enqueue(self.admin, "warm-", 1)
        await self._wait_published("warm-", 1)
        await self._purge()

    async def _relay_run(self, rows: int, *, tag: str) -> float:
        prefix = f"{tag}-"
        committed = await self._enqueue(self.admin, prefix, rows)
        await self._wait_published(prefix, rows)
        last: float = await self.admin.fetchval(
            f"SELECT extract(epoch FROM max(published_at))::float8 FROM {self.table}"
            " WHERE message_id LIKE $1 || '%'",
            prefix,
            timeout=ANSWER_S,
        )
        await self._expect_queued(rows, "relay")
        return rows / max(last - committed, 1e-6)

    async def _paced(self, rate: float, seconds: float) -> Paced:
        """Rows at `rate` a second for `seconds`; commit-to-mark latency per row."""
        per_tx = max(1, math.ceil(rate / PACED_TX_PER_SECOND))
        transactions = max(1, int(rate * seconds / per_tx))
        interval = per_tx / rate
        commits: dict[str, float] = {}
        conns = [
            await asyncpg.connect(self.settings.database.url, timeout=ANSWER_S)
            for _ in range(PACED_CONNECTIONS)
        ]
        free: asyncio.Queue[asyncpg.Connection[asyncpg.Record]] = asyncio.Queue()
        for conn in conns:
            free.put_nowait(conn)

        async def one(k: int) -> None:
            conn = await free.get()  # unbounded: a connection comes back as a send ends
            try:
                async with conn.transaction():
                    await conn.execute(
                        f"INSERT INTO {self.table} (queue, tenant, message_id, body)"
                        " SELECT $1, '', $2 || g, $3 FROM generate_series(1, $4) g",
                        self.queue,
                        f"p{k}-",
                        self.body,
                        per_tx,
                        timeout=ANSWER_S,
                    )
                    # stamped just before COMMIT: the commit's own time counts
                    commits[f"p{k}-"] = await conn.fetchval(
                        "SELECT extract(epoch FROM clock_timestamp())::float8",
                        timeout=ANSWER_S,
                    )
            finally:
                free.put_nowait(conn)

        try:
            started = time.monotonic()
            tasks = []
            for k in range(transactions):
                due = started + k * interval
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(one(k)))
            await asyncio.gather(*tasks)
            await self._wait_published("p", transactions * per_tx)
        finally:
            for conn in conns:
                with contextlib.suppress(Exception):
                    await conn.close()
        marks = await self.admin.fetch(
            f"SELECT split_part(message_id, '-', 1) || '-' AS tx,"
            " extract(epoch FROM published_at)::float8 AS at"
            f" FROM {self.table} WHERE message_id LIKE 'p%'",
            timeout=ANSWER_S,
        )
        latencies = sorted((float(r["at"]) - commits[r["tx"]]) * 1000 for r in marks)
        await self._expect_queued(len(marks), "paced relay")
        return Paced(
            rate=rate,
            rows=len(latencies),
            p50_ms=quantile(latencies, 0.50),
            p99_ms=quantile(latencies, 0.99),
        )


def _summary(medians: dict[str, float], paced: Paced | None) -> str:
    parts = []
    each = medians.get("publisher_each")
    pipelined = medians.get("publisher_pipelined")
    relay = medians.get("relay")
    if each and pipelined:
        parts.append(f"pipelined/each={pipelined / each:.2f}")
    if relay and pipelined:
        parts.append(f"relay/pipelined={relay / pipelined:.2f} (target >= 0.5)")
    if paced is not None:
        parts.append(
            f"relay paced: rate={paced.rate:,.0f}/s rows={paced.rows}"
            f" commit_to_confirm p50={paced.p50_ms:.1f} ms p99={paced.p99_ms:.1f} ms"
            " (target p99 < 50 ms)"
        )
    return "sending: " + " ".join(parts)


async def sending_bench(
    options: BenchOptions,
    settings: Settings,
    sandbox: Sandbox,
    admin: asyncpg.Connection[asyncpg.Record],
    channel: aio_pika.abc.AbstractChannel,
    started: float,
) -> list[str]:
    """Run the sending variants among `options.variants`; return what went wrong."""
    names = [v for v in options.variants if v in SENDING_VARIANTS]
    if not names:
        return []
    runs = SendingBench(
        options=options,
        settings=settings,
        sandbox=sandbox,
        admin=admin,
        channel=channel,
        started=started,
    )
    await runs.run(names)
    return runs.wrong
