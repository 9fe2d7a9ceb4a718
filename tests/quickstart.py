"""The README's quickstart, run as a reader runs it: its files saved, its commands typed.

1. every block that names its file (`# shipments.py`, `-- schema.sql`,
   `# publish.py`) is saved in a folder of the test's own;
2. the block of commands (the one that exports AMQP_URL) runs line by line in
   bash from that folder, with the tools of `bin_dir` first on PATH: an
   `export` line sets the environment of the lines after it; the
   `idempotent-workers run` line starts the worker in the background (the
   reader's first shell); the lines after it (the reader's second shell) run
   once the worker logged `worker_started`;
3. the job's row appears in the `shipments` table; those lines run again
   add no row, and the worker logs `duplicate_ignored`;
4. SIGTERM: the worker exits 0.

Only what isolates one run from the others on the shared services is
changed in the text (`isolated`): the database URL names a fresh database,
the queue a name of the test's own. Every wait has a deadline; a failure
shows the command, its output and the worker's log.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from consumers import RetryPolicy
from consumers.broker.topology import delete
from proving.deadlines import ANSWER_S, within
from tests.code_blocks import code_blocks
from tests.support import wait_for

# The variables of the reader's own shell that must not reach the commands.
_NOT_INHERITED = ("AMQP_URL", "DATABASE_URL", "DATABASE_SCHEMA", "PYTHONPATH", "VIRTUAL_ENV")


@dataclass(frozen=True, slots=True, kw_only=True)
class Quickstart:
    files: dict[str, str]  # name -> text, as the README gives them
    commands: list[str]  # the lines of the block that exports AMQP_URL

    @classmethod
    def from_readme(cls, text: str) -> Quickstart:
        blocks = code_blocks(text)
        files = {b.file_name: b.text for b in blocks if b.file_name is not None}
        runs = [b for b in blocks if b.lang == "sh" and "export AMQP_URL=" in b.text]
        assert len(runs) == 1, "the README has one block of commands that exports AMQP_URL"
        return cls(files=files, commands=runs[0].text.splitlines())

    def exported(self, name: str) -> str:
        """The value the commands export for `name`."""
        for line in self.commands:
            words = shlex.split(line, comments=True)
            if words[:1] == ["export"]:
                for word in words[1:]:
                    key, _, value = word.partition("=")
                    if key == name:
                        return value
        raise AssertionError(f"the README's commands export no {name}")

    @property
    def queue(self) -> str:
        """The queue the README's handler consumes."""
        handlers = [
            m.group(1)
            for text in self.files.values()
            for m in re.finditer(r"@app\.handler\(\"([^\"]+)\"", text)
        ]
        assert len(handlers) == 1, f"one handler in the README's files, found {handlers}"
        return handlers[0]

    def isolated(self, replacements: Mapping[str, str]) -> Quickstart:
        """The same text with each key of `replacements` replaced by its value."""

        def swap(text: str) -> str:
            for old, new in replacements.items():
                text = text.replace(old, new)
            return text

        return replace(
            self,
            files={name: swap(text) for name, text in self.files.items()},
            commands=[swap(line) for line in self.commands],
        )


def _environment(bin_dir: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in _NOT_INHERITED and not k.startswith("IW_")
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run_line(line: str, folder: Path, env: Mapping[str, str], log: Path) -> None:
    done = subprocess.run(
        ["bash", "-c", line], cwd=folder, env=env, capture_output=True, text=True, timeout=ANSWER_S
    )
    assert done.returncode == 0, (
        f"`{line}` exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        f"\n--- the worker's log\n{_tail(log)}"
    )


def _events(log: Path) -> list[str]:
    events = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            events.append(str(json.loads(line).get("event")))
        except (ValueError, AttributeError):
            continue
    return events


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""


async def _shipments(database_url: str) -> list[tuple[int, str]]:
    conn = await asyncpg.connect(database_url, timeout=ANSWER_S)
    try:
        rows = await conn.fetch("SELECT order_id, tenant FROM shipments", timeout=ANSWER_S)
    finally:
        await conn.close(timeout=ANSWER_S)
    return [(r["order_id"], r["tenant"]) for r in rows]


async def _wait_started(worker: subprocess.Popen[bytes], line: str, log: Path) -> None:
    """Until the worker logged `worker_started`; fails at once if it exited."""

    async def started() -> bool:
        code = worker.poll()
        assert code is None, f"`{line}` exited {code}:\n{_tail(log)}"
        return "worker_started" in _events(log)

    await wait_for(started, timeout=ANSWER_S)


async def run_quickstart(quick: Quickstart, folder: Path, *, bin_dir: Path) -> None:
    """Steps 1 to 4 of the module's docstring; fails the test where the README does."""
    for name, text in quick.files.items():  # 1.
        (folder / name).write_text(text)
    env = _environment(bin_dir)
    log = folder / "worker.log"
    worker: subprocess.Popen[bytes] | None = None
    after_run: list[str] = []
    try:
        for line in quick.commands:  # 2.
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if words[0] == "export":
                env.update(word.partition("=")[::2] for word in words[1:])
            elif words[:2] == ["idempotent-workers", "run"]:
                with log.open("wb") as out:
                    worker = subprocess.Popen(
                        ["bash", "-c", f"exec {line}"], cwd=folder, env=env, stdout=out, stderr=out
                    )
                await _wait_started(worker, line, log)
            elif worker is not None:
                after_run.append(line)
                _run_line(line, folder, env, log)
            else:
                _run_line(line, folder, env, log)
        assert worker is not None, "the README's commands never run the worker"
        assert after_run, "the README's commands publish nothing once the worker runs"
        database_url = env["DATABASE_URL"]

        async def row() -> bool:  # 3.
            return len(await _shipments(database_url)) >= 1

        await wait_for(row, timeout=30)
        for line in after_run:
            _run_line(line, folder, env, log)

        async def ignored() -> bool:
            return "duplicate_ignored" in _events(log)

        await wait_for(ignored, timeout=30)
        rows = await _shipments(database_url)
        assert len(rows) == 1, f"the job's effect happened {len(rows)} times: {rows}"
        worker.send_signal(signal.SIGTERM)  # 4.
        code = await asyncio.to_thread(worker.wait, 30)
        assert code == 0, f"the worker exited {code} on SIGTERM:\n{_tail(log)}"
    except BaseException:
        print(f"--- the worker's log\n{_tail(log)}")
        raise
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(timeout=ANSWER_S)


@asynccontextmanager
async def database_of_its_own(database_url: str) -> AsyncIterator[str]:
    """The URL of a fresh database beside `database_url`'s, dropped after."""
    name = f"readme_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(database_url, timeout=ANSWER_S)
    try:
        await conn.execute(f"CREATE DATABASE {name}", timeout=ANSWER_S)
        try:
            yield urlunsplit(urlsplit(database_url)._replace(path=f"/{name}"))
        finally:
            await conn.execute(f"DROP DATABASE {name} WITH (FORCE)", timeout=ANSWER_S)
    finally:
        await conn.close(timeout=ANSWER_S)


@asynccontextmanager
async def queue_of_its_own(amqp_url: str) -> AsyncIterator[str]:
    """A queue name for the README's handler; its queues (default retry policy) deleted after."""
    name = f"readme.{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        connection = await aio_pika.connect(amqp_url, timeout=ANSWER_S)
        async with connection:
            channel = await within(ANSWER_S, "a channel", connection.channel())
            await within(ANSWER_S, "deleting the queues", delete(channel, name, RetryPolicy()))
