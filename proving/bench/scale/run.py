"""The scale runs: processes started on one pre-filled queue, timed from inside each."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import aio_pika
import asyncpg

from consumers import Settings
from proving.bench.options import BenchOptions, parse
from proving.bench.rounds import SETTLE_SECONDS, say
from proving.bench.sandbox import Sandbox
from proving.bench.scale.instrument import DIR_ENV
from proving.bench.workload import publish_backlog
from proving.deadlines import ANSWER_S, within

POLL_SECONDS = 0.05
STOP_SECONDS = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    name: str
    framework: bool
    processes: int


SETUPS = (
    Setup(name="processes=1", framework=True, processes=1),
    Setup(name="processes=2", framework=True, processes=2),
    Setup(name="bare_1", framework=False, processes=1),
    Setup(name="bare_2", framework=False, processes=2),
)


@dataclass(slots=True)
class Rates:
    runs: dict[str, list[float]] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)

    def median(self, name: str) -> float:
        return statistics.median(self.runs[name]) if self.runs.get(name) else 0.0


def scale_line(rates: Rates) -> str:
    one, two = rates.median("processes=1"), rates.median("processes=2")
    bare_1, bare_2 = rates.median("bare_1"), rates.median("bare_2")

    def ratio(top: float, bottom: float) -> str:
        return f"{top / bottom:.2f}" if bottom else "n/a"

    return (
        f"scale: processes=1 rate={one:.0f} processes=2 rate={two:.0f}"
        f" bare_1={bare_1:.0f} bare_2={bare_2:.0f}"
        f" two/bare_1={ratio(two, bare_1)} two/bare_2={ratio(two, bare_2)}"
    )


class ScaleRounds:
    def __init__(
        self,
        *,
        options: BenchOptions,
        settings: Settings,
        sandbox: Sandbox,
        admin: asyncpg.Connection,
        channel: aio_pika.abc.AbstractChannel,
        log: IO[bytes],
    ) -> None:
        self.options = options
        self.settings = settings
        self.sandbox = sandbox
        self.admin = admin
        self.channel = channel
        self.log = log
        self._seed = 0
        self.wrong: list[str] = []

    def _commands(self, setup: Setup) -> list[list[str]]:
        python = sys.executable
        if setup.framework:
            command = [python, "-m", "consumers", "run", "proving.bench.scale.app:app"]
            if setup.processes > 1:
                command += ["--processes", str(setup.processes)]
            return [command]
        bare = [
            python,
            "-m",
            "proving.bench.scale.bare",
            self.settings.amqp.url,
            self.sandbox.queue,
            str(self.options.prefetch),
        ]
        return [bare] * setup.processes

    def _env(self, directory: Path) -> dict[str, str]:
        return {
            **os.environ,
            "AMQP_URL": ",".join(self.settings.amqp.urls),
            "DATABASE_URL": self.settings.database.url,
            "DATABASE_SCHEMA": self.sandbox.schema,
            "IW_QUEUE_TYPE": str(self.settings.amqp.queue_type),
            "IW_PREFETCH": str(self.options.prefetch),
            "BENCH_QUEUE": self.sandbox.queue,
            DIR_ENV: str(directory),
        }

    async def once(self, setup: Setup, label: str) -> float:
        n = self.options.messages
        queue = await self.channel.get_queue(self.sandbox.queue, ensure=False)
        await queue.purge(timeout=ANSWER_S)
        await self.sandbox.reset(self.admin, keep_claims=False)
        self._seed += 1
        await publish_backlog(self.channel, self.sandbox.queue, n, seed=self._seed)
        await self.admin.execute("CHECKPOINT", timeout=ANSWER_S)
        await asyncio.sleep(SETTLE_SECONDS)
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
            directory = Path(tmp)
            procs = [
                await asyncio.create_subprocess_exec(
                    *command, env=self._env(directory), stdout=self.log, stderr=self.log
                )
                for command in self._commands(setup)
            ]
            try:
                await self._wait_acked(directory, n)
            finally:
                for proc in procs:
                    proc.send_signal(signal.SIGTERM)
                codes = [await asyncio.wait_for(p.wait(), STOP_SECONDS) for p in procs]
            acked, first, last = _read(directory)
        rate = acked / (last - first) if last > first else 0.0
        verdict = f"exit codes {codes}"
        # Every message is acked by then: a process still starting when the
        # SIGTERM came (the others took the whole backlog) dies of it holding nothing.
        if any(code not in (0, -signal.SIGTERM) for code in codes):
            self.wrong.append(f"{setup.name}: exit codes {codes}")
        if setup.framework:
            rows, distinct = await self.sandbox.effects(self.admin)
            if rows == distinct == n:
                verdict += ", effects ok"
            else:
                problem = f"{setup.name}: effects={rows} distinct={distinct} expected={n}"
                self.wrong.append(problem)
                verdict += f", EFFECTS WRONG ({problem})"
        say(f"{label} {setup.name:<12} {rate:>8,.0f} msg/s  {acked} acked  {verdict}")
        return rate

    async def _wait_acked(self, directory: Path, n: int) -> None:
        deadline = time.monotonic() + self.options.timeout
        while _read(directory)[0] < n:
            if time.monotonic() > deadline:
                acked = _read(directory)[0]
                raise TimeoutError(f"{acked} of {n} acked in {self.options.timeout:.0f} s")
            await asyncio.sleep(POLL_SECONDS)

    async def rounds(self) -> Rates:
        rates = Rates()
        total = len(SETUPS) * self.options.repeats
        done = 0
        for k in range(self.options.repeats):
            shift = k % len(SETUPS)
            for setup in [*SETUPS[shift:], *SETUPS[:shift]]:
                done += 1
                rate = await self.once(setup, f"scale [{done:>2}/{total}]")
                rates.runs.setdefault(setup.name, []).append(rate)
        rates.wrong = self.wrong
        return rates


def _read(directory: Path) -> tuple[int, float, float]:
    """(acks, first delivery, last ack) over every process's file."""
    acked, firsts, lasts = 0, [], []
    for path in directory.glob("*.json"):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now: read next time
        acked += int(report["acked"])
        if report["first"]:
            firsts.append(float(report["first"]))
            lasts.append(float(report["last"]))
    return acked, min(firsts, default=0.0), max(lasts, default=0.0)


async def scale(options: BenchOptions, settings: Settings, log: IO[bytes]) -> int:
    amqp = replace(settings.amqp, queue_type=options.queue_type or settings.amqp.queue_type)
    sandbox = Sandbox.fresh(amqp)
    settings = replace(settings, amqp=amqp)
    admin = await asyncpg.connect(settings.database.url, timeout=ANSWER_S)
    connection = await aio_pika.connect(amqp.url, timeout=ANSWER_S)
    rates = Rates()
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel(publisher_confirms=True))
        await sandbox.create(admin, channel)
        say(
            f"bench --scale: {options.messages:,} messages per run, {options.repeats} runs per"
            f" setup, {os.cpu_count()} cores, {amqp.queue_type} queue, prefetch"
            f" {options.prefetch}, logs to {options.log_file}, schema {sandbox.schema}"
        )
        rounds = ScaleRounds(
            options=options,
            settings=settings,
            sandbox=sandbox,
            admin=admin,
            channel=channel,
            log=log,
        )
        rates = await rounds.rounds()
        say(scale_line(rates))
    finally:
        try:
            await sandbox.drop(admin, await within(ANSWER_S, "a channel", connection.channel()))
        finally:
            await connection.close()
            await admin.close()
    for line in rates.wrong:
        say(f"bench: WRONG {line}")
    return 1 if rates.wrong else 0


def main(argv: Sequence[str], settings: Settings) -> int:
    """`idempotent-workers bench --scale ...`."""
    options = parse(argv)
    with open(options.log_file, "wb") as log:  # the processes' log lines, emptied first
        return asyncio.run(scale(options, settings, log))
