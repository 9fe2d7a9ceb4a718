"""Test helpers: real worker processes, waiting, reading queues."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import aio_pika
from prometheus_client.parser import text_string_to_metric_families

from consumers import dead_letter_queue
from dedupe import DbConnection, generations
from dedupe.generations import FAMILIES
from proving.deadlines import ANSWER_S, deadline, within
from proving.keptlogs import keep_log

ROOT = Path(__file__).resolve().parent.parent


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float = 30.0, interval: float = 0.05
) -> None:
    """Poll `predicate` until it holds; fail the test after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


async def settle(
    read: Callable[[], Awaitable[object]], *, quiet: float = 1.0, timeout: float = 120.0
) -> object:
    """Wait until `read()` stops changing for `quiet` seconds; return its value.

    Fails the test if it still changes after `timeout` seconds.
    """
    async with deadline(timeout, f"a reading to stay the same for {quiet} s"):
        last = await read()
        while True:
            await asyncio.sleep(quiet)
            now = await read()
            if now == last:
                return now
            last = now


class WorkerProcess:
    """`python -m consumers run MODULE:APP` as a real child process."""

    # Every one started in this test (tests/conftest.py prints their logs if it fails).
    started: ClassVar[list[WorkerProcess]] = []

    def __init__(
        self,
        target: str,
        env: Mapping[str, str],
        log_path: Path,
        *,
        extra_env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        full = {**os.environ, **env, **(extra_env or {})}
        full["PYTHONPATH"] = str(ROOT)
        self.log_path = log_path
        self.killed = False  # SIGKILLed by the test: its exit says nothing
        self.log_kept = False
        WorkerProcess.started.append(self)
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "consumers", "run", target, *args],
            env=full,
            cwd=ROOT,
            stdout=self._log,
            stderr=self._log,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float = 30.0) -> int:
        deadline = asyncio.get_running_loop().time() + timeout
        while self.proc.poll() is None:
            if asyncio.get_running_loop().time() > deadline:
                self.proc.kill()
                self.proc.wait()
                self.keep_log(f"did not exit within {timeout} s")
                raise AssertionError(f"worker {self.pid} did not exit within {timeout} s")
            await asyncio.sleep(0.05)
        self._log.close()
        self._check_exit()
        return self.proc.returncode

    def _check_exit(self) -> None:
        """A non-zero exit the test did not cause: keep the log, which goes with tmp_path."""
        code = self.proc.returncode
        if code not in (0, None) and not (self.killed and code == -signal.SIGKILL):
            self.keep_log(f"exited {code}")

    def keep_log(self, why: str) -> None:
        """Copy the log out of the test's directory and print its end (once a worker)."""
        if self.log_kept:
            return
        self.log_kept = True
        if not self._log.closed:
            self._log.flush()
        keep_log(self.log_path, f"test-worker-{self.pid}-{self.log_path.name}", f"worker {why}")

    async def expect_exit(self, code: int, timeout: float = 30.0) -> None:
        """Wait for the exit; on any other exit status fail with the end of the worker's log."""
        got = await self.wait(timeout)  # unbounded: it has its timeout, as an argument
        if got != code:
            tail = "\n".join(self.log_text().splitlines()[-60:])
            raise AssertionError(
                f"worker {self.pid} exited {got}, expected {code}; its log ends:\n{tail}"
            )

    def stop_now(self) -> None:
        """Cleanup: kill if still running, reap, close the log."""
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
        elif not self._log.closed:  # exited, and no wait() looked at how
            self._check_exit()
        self.proc.wait()
        if not self._log.closed:
            self._log.close()

    async def wait_logged(self, event: str, timeout: float = 60.0) -> None:
        """Wait until the worker's log has a line with `event` (e.g. `worker_started`)."""

        async def logged() -> bool:
            return f'"event":"{event}"' in self.log_text()

        await wait_for(logged, timeout=timeout)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines whose event is `name`, in order."""
        found = []
        for line in self.log_text().splitlines():
            if f'"{name}"' not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == name:
                    found.append(record)
        return found

    async def endpoint(self, timeout: float = 30.0) -> str:
        """The base URL of the process's /metrics, /healthz, /readyz (IW_METRICS_PORT=0)."""

        async def serving() -> bool:
            return bool(self.events("endpoint_serving"))

        await wait_for(serving, timeout=timeout)
        return f"http://127.0.0.1:{self.events('endpoint_serving')[0]['port']}"


async def http_get(url: str) -> tuple[int, str]:
    """GET `url` (from a thread, the test's loop stays free): (status, body)."""

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as refused:
            return int(refused.code), refused.read().decode()

    return await asyncio.to_thread(get)


async def scrape(base: str) -> dict[str, float]:
    """`/metrics` as {'name{label="v",...}': value}, labels sorted; fails on a non-200."""
    status, text = await http_get(f"{base}/metrics")
    assert status == 200, text
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


async def publish_confirmed(
    channel: aio_pika.abc.AbstractChannel,
    message: aio_pika.Message,
    queue: str,
    *,
    timeout: float = 30.0,
) -> None:
    """Publish `message` to `queue` on a confirm channel until the broker confirms it.

    A nack says the broker did not take the message; a careful publisher (ours,
    `consumers.Publisher`) publishes it again. RabbitMQ has nacked the first
    publish to a quorum queue a worker had declared a moment before (once in
    a full `.ci/run` on a busy machine), so a test's own publish retries too.
    """
    async with deadline(timeout, f"a confirm for {message.message_id!r} to {queue}"):
        while True:
            try:
                await channel.default_exchange.publish(message, routing_key=queue)
                return
            except aio_pika.exceptions.DeliveryError as nacked:
                print(f"publish_confirmed: {message.message_id!r} nacked ({nacked!r}); again")
                await asyncio.sleep(0.1)


async def queue_counts(url: str, queue: str) -> tuple[int, int] | None:
    """`queue`'s (ready messages, consumers), as a passive declare on a connection of
    its own reads them; None if the queue does not exist."""
    connection = await aio_pika.connect(url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel to the broker", connection.channel())
        declared = await channel.declare_queue(queue, passive=True, timeout=ANSWER_S)
        result = declared.declaration_result
        return result.message_count or 0, result.consumer_count or 0
    except aio_pika.exceptions.ChannelClosed:
        return None
    finally:
        await connection.close()


async def wait_declared(url: str, queue: str) -> None:
    """Wait until a worker process has declared `queue` (its topology is up)."""

    async def declared() -> bool:
        return await queue_counts(url, queue) is not None

    await wait_for(declared, timeout=30)


async def wait_consumers(url: str, queue: str, n: int, *, timeout: float = 30.0) -> None:
    """Wait until `queue` has at least `n` consumers (every worker is consuming)."""

    async def consuming() -> bool:
        counts = await queue_counts(url, queue)
        return counts is not None and counts[1] >= n

    await wait_for(consuming, timeout=timeout)


async def drain_dead_letters(
    channel: aio_pika.abc.AbstractChannel, queue: str
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Take every message from the queue's dead-letter queue (acked)."""
    dlq = await channel.get_queue(dead_letter_queue(queue), ensure=True)
    taken = []
    while (message := await dlq.get(no_ack=True, fail=False, timeout=ANSWER_S)) is not None:
        taken.append(message)
    return taken


def run_to_end(
    argv: list[str], *, timeout: float, grace: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run `argv` from ROOT to its end; past `timeout`, SIGTERM it and fail with its output.

    The chaos command answers SIGTERM with every task's stack on stderr, then
    tears down: a run that does not end says what it was waiting for.
    """
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(argv)} did not end within {timeout:.0f} s (SIGTERMed)\n"
            f"stdout ends:\n{out[-3000:]}\nstderr ends:\n{err[-6000:]}"
        ) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def close_broker_connections(name: str) -> int:
    """Close the broker connections whose client-given name is `name`; return how many."""
    listed = subprocess.run(
        ["rabbitmqctl", "list_connections", "pid", "client_properties", "-q", "--no-table-headers"],
        check=True,
        capture_output=True,
        text=True,
    )
    closed = 0
    for line in listed.stdout.splitlines():
        pid, _, properties = line.partition("\t")
        if f'{{"connection_name","{name}"}}' in properties:
            subprocess.run(
                ["rabbitmqctl", "close_connection", pid, "test: drop the worker"],
                check=True,
                capture_output=True,
            )
            closed += 1
    return closed


async def no_message_ready(url: str, queue: str) -> bool:
    """Whether `queue` has no message waiting: each is acked or in a consumer's hands."""
    counts = await queue_counts(url, queue)
    if counts is None:
        raise AssertionError(f"{queue} does not exist")
    return counts[0] == 0


async def end_generation_0(db: DbConnection, schema: str) -> None:
    """Every table's generation 0 ended 8 days ago (past a week's retention); 1 current."""
    await within(
        ANSWER_S, "a rotation of every table", generations.rotate_together(db, schema, FAMILIES)
    )
    await within(
        ANSWER_S,
        "generation 0's end moved back",
        db.execute(
            "UPDATE dedupe_generations SET ended_at = now() - interval '8 days'"
            " WHERE generation = 0"
        ),
    )


async def forbid_delete(db: DbConnection) -> None:
    """From now on every DELETE statement on a table kept in generations fails."""
    triggers = [
        "CREATE FUNCTION no_delete() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN RAISE EXCEPTION 'DELETE on %', TG_TABLE_NAME; END $$"
    ] + [
        f"CREATE TRIGGER no_delete BEFORE DELETE ON {family.table}"
        " FOR EACH STATEMENT EXECUTE FUNCTION no_delete()"
        for family in FAMILIES
    ]
    for statement in triggers:
        await within(ANSWER_S, "the DELETE guard's triggers", db.execute(statement))
