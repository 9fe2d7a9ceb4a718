"""The end-to-end fuzz: generated raw messages through a real worker, each accounted for.

    python -m proving.fuzz --inputs 100000

1. a private RabbitMQ node (some inputs crash a broker channel: the broker
   refuses a NaN double in a header table with INTERNAL_ERROR, and the shared
   broker is no place for that), a fresh schema on the configured PostgreSQL,
   one worker process (`proving.fuzz.app`) consuming the queue;
2. `--inputs` raw messages drawn from `proving.fuzz.inputs`, published byte
   for byte as drawn, each marked with an `x-fuzz-n` header and, where it has
   a message id, a unique `fz<n>-` prefix on it (so none is a duplicate of another);
3. once every input is an effect row or a dead letter (or the deadline
   passed), SIGTERM the worker, take the dead-letter queue and count:
   every input must end as exactly one effect or a dead letter with an
   `x-reason`, the worker must never exit (0 crashes) and exit 0 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

import aio_pika
import asyncpg
from hypothesis import HealthCheck, Phase, given, seed, settings

from consumers import REASON_HEADER, dead_letter_queue, tier_queue
from dedupe import migrate, quote_ident
from proving.chaos.services import PrivateRabbit, free_port, remove_tree
from proving.deadlines import deadline
from proving.fuzz.app import EFFECTS_TABLE, RETRY
from proving.fuzz.inputs import RawInput, raw_inputs
from proving.keptlogs import keep_log
from proving.rawamqp import READ_DEADLINE_S, BrokerRefused, RawPublisher

MARK_HEADER = "x-fuzz-n"
WINDOW = 200  # publishes in flight before waiting for their confirms
MAX_BODY_BYTES = 4096  # small, so the body_too_large inputs stay small too
QUERY_TIMEOUT_S = 30.0  # a count, a declare or a get on the private node and the database
SETUP_DEADLINE_S = 60.0  # migrating a fresh schema and opening a channel
_PREFIX = re.compile(r"^fz(\d+)-")


@dataclass(slots=True, kw_only=True)
class FuzzOutcome:
    inputs: int
    published: int = 0
    refused: int = 0  # the broker would not take it (closed the channel)
    effects: int = 0
    dead_lettered: int = 0
    without_reason: int = 0  # dead letters with no x-reason
    doubled: int = 0  # an input with more than one effect row
    unaccounted: int = 0  # neither an effect nor a dead letter at the end
    crashes: int = 0  # worker exits while running, or a SIGTERM not exiting 0
    undecidable: int = 0  # `message_undecidable` lines: a framework failure isolated
    seconds: float = 0.0
    reasons: Counter[str] = field(default_factory=Counter)
    crash_logs: list[str] = field(default_factory=list)
    undecidable_lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.crashes == 0
            and self.unaccounted == 0
            and self.doubled == 0
            and self.without_reason == 0
            and self.undecidable == 0
        )


def summary_line(outcome: FuzzOutcome) -> str:
    return (
        f"fuzz: inputs={outcome.inputs} published={outcome.published}"
        f" refused={outcome.refused} effects={outcome.effects}"
        f" dead_lettered={outcome.dead_lettered} without_reason={outcome.without_reason}"
        f" doubled={outcome.doubled} unaccounted={outcome.unaccounted}"
        f" crashes={outcome.crashes} undecidable={outcome.undecidable}"
        f" seconds={outcome.seconds:.0f}"
    )


def generate(count: int, seed_value: int) -> list[RawInput]:
    """`count` inputs drawn by hypothesis (generation only, no shrinking, no database)."""
    drawn: list[RawInput] = []
    round_seed = seed_value
    while len(drawn) < count:

        @settings(
            max_examples=count - len(drawn),
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
            deadline=None,
        )
        @given(raw_inputs())
        def collect(raw: RawInput) -> None:
            drawn.append(raw)

        seed(round_seed)(collect)()
        round_seed += 1
    return drawn[:count]


def _prefixed(value: bytes | str, prefix: str) -> bytes | str:
    if isinstance(value, bytes):
        return (prefix.encode() + value)[:255]
    text = prefix + value
    while len(text.encode()) > 255:
        text = text[:-1]
    return text


def marked(raw: RawInput, n: int) -> RawInput:
    """`raw` with `x-fuzz-n: n`, and a message id made unique by a `fz<n>-` prefix."""
    props = raw.properties
    headers = {**(props.headers or {}), MARK_HEADER: n}
    message_id = props.message_id
    if message_id:
        message_id = _prefixed(message_id, f"fz{n}-")
    return RawInput(
        properties=replace(props, headers=headers, message_id=message_id), body=raw.body
    )


async def publish(
    raw_inputs_: list[RawInput], queue: str, host: str, port: int
) -> tuple[int, set[int]]:
    """Publish every input, `WINDOW` at a time; (confirmed, indices the broker refused)."""
    published = 0
    refused: set[int] = set()
    # unbounded: its connect and each frame read have deadlines (proving.rawamqp)
    publisher = await RawPublisher.connect(host=host, port=port)
    try:
        for start in range(0, len(raw_inputs_), WINDOW):
            window = raw_inputs_[start : start + WINDOW]
            try:
                for raw in window:
                    publisher.send(queue, raw.body, raw.properties)
                await publisher.confirm()
                published += len(window)
                continue
            except (BrokerRefused, OSError, asyncio.IncompleteReadError):
                await publisher.close()
            # One at a time, to tell which the broker refuses (a copy of an
            # input confirmed before the refusal is acked as a duplicate).
            for n, raw in enumerate(window, start):
                # unbounded: its connect and each frame read have deadlines (proving.rawamqp)
                publisher = await RawPublisher.connect(host=host, port=port)
                try:
                    await publisher.publish(queue, raw.body, raw.properties)  # unbounded: as above
                    published += 1
                except (BrokerRefused, OSError, asyncio.IncompleteReadError):
                    refused.add(n)
                await publisher.close()
            # unbounded: its connect and each frame read have deadlines (proving.rawamqp)
            publisher = await RawPublisher.connect(host=host, port=port)
    finally:
        await publisher.close()
    return published, refused


class _Worker:
    """The worker process; restarted (and counted as a crash) if it exits on its own."""

    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.crashes = 0
        self.crash_logs: list[str] = []

    def start(self) -> None:
        log_file = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "consumers", "run", "proving.fuzz.app:app"],
            env=self.env,
            stdout=log_file,
            stderr=log_file,
        )
        log_file.close()

    def check(self) -> None:
        """A worker that exited by itself is a crash: keep its log's end, start another."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            self._crashed(f"exited {self.proc.returncode} while running")
            self.start()

    def _crashed(self, why: str) -> None:
        self.crashes += 1
        tail = self.log_path.read_text(errors="replace").splitlines()[-40:]
        self.crash_logs.append(f"worker {why}; its log ends:\n" + "\n".join(tail))

    async def stop(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.returncode != 0:
            self._crashed(f"exited {self.proc.returncode} on SIGTERM")


async def _pending(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    total = 0
    for name in [queue, *(tier_queue(queue, t) for t in RETRY.tiers_seconds)]:
        declared = await channel.declare_queue(name, passive=True, timeout=QUERY_TIMEOUT_S)
        total += declared.declaration_result.message_count or 0
    return total


async def _dead_count(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(
        dead_letter_queue(queue), passive=True, timeout=QUERY_TIMEOUT_S
    )
    return declared.declaration_result.message_count or 0


async def _take_dead_letters(
    channel: aio_pika.abc.AbstractChannel, queue: str, outcome: FuzzOutcome
) -> dict[int, int]:
    """Every dead letter off the DLQ; its count per input."""
    dlq = await channel.get_queue(dead_letter_queue(queue), ensure=False)
    per_input: Counter[int] = Counter()
    while (message := await dlq.get(no_ack=True, fail=False, timeout=QUERY_TIMEOUT_S)) is not None:
        headers = message.headers or {}
        reason = headers.get(REASON_HEADER)
        if not reason:
            outcome.without_reason += 1
        outcome.reasons[str(reason or "none")] += 1
        mark = headers.get(MARK_HEADER)
        if isinstance(mark, int):
            per_input[mark] += 1
    return per_input


async def run_fuzz(
    database_url: str, *, inputs: int, seed_value: int = 1, deadline_s: float = 0
) -> FuzzOutcome:
    outcome = FuzzOutcome(inputs=inputs)
    started = time.monotonic()
    drawn = [marked(raw, n) for n, raw in enumerate(generate(inputs, seed_value))]
    workdir = Path(tempfile.mkdtemp(prefix="iw-fuzz-"))
    rabbit = PrivateRabbit(
        workdir / "rabbitmq", free_port(), free_port(), node=f"fuzz{os.getpid()}@localhost"
    )
    try:
        await rabbit.start()
        outcome = await _fuzz(rabbit.url, database_url, drawn, workdir, deadline_s, outcome)
    finally:
        await rabbit.stop()
        remove_tree(workdir)
    outcome.seconds = time.monotonic() - started
    return outcome


async def _fuzz(
    amqp_url: str,
    database_url: str,
    drawn: list[RawInput],
    workdir: Path,
    deadline_s: float,
    outcome: FuzzOutcome,
) -> FuzzOutcome:
    inputs = len(drawn)
    queue = "fuzz.inputs"
    schema = f"fuzz_{uuid.uuid4().hex[:10]}"
    async with deadline(SETUP_DEADLINE_S, "the fuzz schema and a channel to the private node"):
        db = await asyncpg.connect(database_url, timeout=10, command_timeout=QUERY_TIMEOUT_S)
        await migrate(db, schema)
        await db.execute(f"SET search_path TO {quote_ident(schema)}")
        await db.execute(EFFECTS_TABLE)
        connection = await aio_pika.connect(amqp_url, timeout=10)
        channel = await connection.channel()
    env = {
        **os.environ,
        "AMQP_URL": amqp_url,
        "DATABASE_URL": database_url,
        "DATABASE_SCHEMA": schema,
        "FUZZ_QUEUE": queue,
        "IW_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
        "IW_SHUTDOWN_GRACE": "15",
    }
    worker = _Worker(env, workdir / "worker.log")
    try:
        worker.start()
        await _wait_declared(connection, queue, worker)
        address = urlsplit(amqp_url)
        # A confirm per window, each frame within READ_DEADLINE_S; one at a time after a refusal.
        async with deadline((inputs / WINDOW + 1) * READ_DEADLINE_S, "publishing the fuzz inputs"):
            outcome.published, refused = await publish(
                drawn, queue, address.hostname or "127.0.0.1", address.port or 5672
            )
        outcome.refused = len(refused)
        limit = time.monotonic() + (deadline_s or max(120.0, inputs / 100))
        while time.monotonic() < limit:
            worker.check()
            effects = await db.fetchval(
                "SELECT count(*) FROM fuzz_effects", timeout=QUERY_TIMEOUT_S
            )
            settled = effects + await _dead_count(channel, queue)
            if settled >= outcome.published and await _pending(channel, queue) == 0:
                break
            await asyncio.sleep(1)
        await worker.stop()
        dead = await _take_dead_letters(channel, queue, outcome)
        rows = await db.fetch("SELECT message_id FROM fuzz_effects", timeout=QUERY_TIMEOUT_S)
        effected: Counter[int] = Counter()
        for row in rows:
            if (found := _PREFIX.match(row["message_id"])) is not None:
                effected[int(found.group(1))] += 1
        outcome.effects = len(rows)
        outcome.dead_lettered = sum(dead.values())
        outcome.doubled = sum(c - 1 for c in effected.values() if c > 1)
        outcome.unaccounted = sum(
            1 for n in range(inputs) if not (effected[n] or dead.get(n) or n in refused)
        )
        log_text = worker.log_path.read_text(errors="replace")
        undecidable = [line for line in log_text.splitlines() if "message_undecidable" in line]
        outcome.undecidable = len(undecidable)
        outcome.undecidable_lines = undecidable[:5]
        if outcome.undecidable or worker.crashes:
            keep_log(worker.log_path, f"{workdir.name}-fuzz-worker.log", "fuzz worker", tail=5)
    finally:
        if worker.proc is not None and worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()
        outcome.crashes = worker.crashes
        outcome.crash_logs = worker.crash_logs
        with contextlib.suppress(Exception):
            await connection.close()
        await db.execute(f"DROP SCHEMA {quote_ident(schema)} CASCADE", timeout=QUERY_TIMEOUT_S)
        await db.close()
    return outcome


async def _wait_declared(
    connection: aio_pika.abc.AbstractConnection, queue: str, worker: _Worker
) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        worker.check()
        try:
            # a refused passive declare closes the channel
            probe = await asyncio.wait_for(connection.channel(), QUERY_TIMEOUT_S)
            await probe.declare_queue(queue, passive=True, timeout=QUERY_TIMEOUT_S)
            await probe.close()
            return
        except aio_pika.exceptions.ChannelClosed:
            await asyncio.sleep(0.2)
    raise TimeoutError(f"the worker did not declare {queue} within 60 s")
