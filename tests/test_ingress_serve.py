"""`idempotent-workers serve` as users run it: the client over real HTTP, and schemathesis."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dedupe import DbConnection
from ingress.client import Refused, SendClient
from tests.conftest import DATABASE_URL
from tests.support import ROOT, wait_for

JOB = {"targets": [{"platform": "ios", "token": "t"}], "notification": {"title": "hi"}}


@dataclass(frozen=True, slots=True)
class Serving:
    url: str
    key: str


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "consumers", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


@pytest.fixture
async def serving(db: DbConnection, schema: str, tmp_path: Path) -> AsyncIterator[Serving]:
    env = {**os.environ, "DATABASE_URL": DATABASE_URL, "DATABASE_SCHEMA": schema}
    env["PYTHONPATH"] = str(ROOT)
    key = cli(env, "api-key", "create", "--tenant", "acme").stdout.strip()
    assert key.startswith("iwk_")
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "consumers", "serve", "--port", "0"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
    try:

        async def listening() -> bool:
            assert proc.poll() is None, log_path.read_text()
            return "listening on" in log_path.read_text()

        await wait_for(listening, timeout=60)
        found = re.search(r"listening on (http://\S+)", log_path.read_text())
        assert found is not None
        yield Serving(url=found[1], key=key)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0, log_path.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_client_against_the_real_serve(serving: Serving, db: DbConnection) -> None:
    async with SendClient(serving.url, api_key=serving.key) as client:
        first = await client.send(JOB, idempotency_key="order-1042")
        again = await client.send(JOB, idempotency_key="order-1042")
        with pytest.raises(Refused) as reused:
            await client.send({**JOB, "priority": "high"}, idempotency_key="order-1042")
        fresh = await client.send(JOB)
    assert (first.status, first.replayed) == ("queued", False)
    assert (again.status, again.replayed, again.id) == ("duplicate_ignored", True, first.id)
    assert (reused.value.status, reused.value.error) == (422, "idempotency_key_reused")
    assert fresh.status == "queued" and fresh.id != first.id
    assert await db.fetchval("SELECT count(*) FROM ingress_messages") == 2
    assert await db.fetchval("SELECT count(*) FROM outbox") == 2


@pytest.mark.timeout(400)
def test_schemathesis_finds_no_failure_against_the_live_openapi(serving: Serving) -> None:
    """`st run` with every check against serve's own /openapi.json, bounded in examples."""
    st = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [
            str(st),
            "--config-file",
            str(ROOT / "tests" / "schemathesis.toml"),
            "run",
            f"{serving.url}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            "25",
            "--header",
            f"Authorization: Bearer {serving.key}",
            "--seed",
            "1042",
            "--request-timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=360,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "No issues found" in result.stdout
