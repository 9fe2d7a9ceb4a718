"""Every long-running command whose start fails on a service says so the same way.

`run`, `relay` and `serve` started with PostgreSQL or RabbitMQ at a port where
nothing listens: one `start_failed` JSON line with the error, exit status 3
(EXIT_START_FAILED: a supervisor or an orchestrator restarts it), and no
traceback, which would say nothing the line does not.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from consumers.telemetry.failed_start import EXIT_START_FAILED
from dedupe import DbConnection
from proving.chaos.services import free_port
from tests.support import ROOT

START_S = 60.0  # a refused connection answers at once; this bounds a hang


def _dead_database() -> str:
    return f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"


def _dead_broker() -> str:
    return f"amqp://guest:guest@127.0.0.1:{free_port()}/"


async def _start(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    """`python -m consumers COMMAND` to its exit, within START_S (a hang fails the test)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "consumers", *command],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=START_S,
    )


def _start_failed_line(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one `start_failed` line, after checking the exit status and that no traceback came."""
    said = f"exit status {done.returncode}; stderr:\n{done.stderr}\nstdout:\n{done.stdout}"
    assert done.returncode == EXIT_START_FAILED, said
    assert "Traceback" not in done.stderr + done.stdout, said
    lines: list[dict[str, Any]] = [
        json.loads(text) for text in done.stderr.splitlines() if '"start_failed"' in text
    ]
    assert len(lines) == 1, said
    (line,) = lines
    assert line["event"] == "start_failed"
    assert line["exit_code"] == EXIT_START_FAILED
    return line


@pytest.mark.parametrize(
    "command",
    [("run", "tests.apps.effects:app"), ("relay",), ("serve", "--port", "0")],
    ids=["run", "relay", "serve"],
)
async def test_a_command_whose_database_is_down_exits_start_failed_not_a_traceback(
    command: tuple[str, ...], worker_env: dict[str, str]
) -> None:
    done = await _start({**worker_env, "DATABASE_URL": _dead_database()}, *command)
    line = _start_failed_line(done)
    assert line["error"].startswith("ConnectionRefusedError"), line


@pytest.mark.parametrize(
    "command", [("run", "tests.apps.effects:app"), ("relay",)], ids=["run", "relay"]
)
async def test_a_command_whose_broker_is_down_exits_start_failed_not_a_traceback(
    command: tuple[str, ...], worker_env: dict[str, str], db: DbConnection
) -> None:
    done = await _start({**worker_env, "AMQP_URL": _dead_broker()}, *command)
    line = _start_failed_line(done)
    assert line["error"].startswith("AMQPConnectionError"), line
