"""`idempotent-workers serve` as users run it: the client over real HTTP, and schemathesis."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from consumers.runtime.listening import listening_socket
from dedupe import DbConnection
from ingress.client import Refused, SendClient
from proving.deadlines import ANSWER_S
from tests.conftest import DATABASE_URL
from tests.support import ROOT, wait_for
from tests.webhook_support import KEY

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


def _text(path: Path) -> str:
    return path.read_text()


@asynccontextmanager
async def started(env: dict[str, str], log_path: Path, *command: str) -> AsyncIterator[str]:
    """`python -m COMMAND --port 0` until the block ends (SIGTERM: exit 0); its URL."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", *command, "--port", "0"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
    try:

        async def listening() -> bool:
            assert proc.poll() is None, _text(log_path)
            return "listening on" in _text(log_path)

        await wait_for(listening, timeout=60)
        found = re.search(r"listening on (http://\S+)", _text(log_path))
        assert found is not None
        yield found[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0, _text(log_path)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def env(schema: str) -> dict[str, str]:
    """serve with every route on: webhook and e-mail queues, the endpoints' secrets' key."""
    return {
        **os.environ,
        "DATABASE_URL": DATABASE_URL,
        "DATABASE_SCHEMA": schema,
        "PYTHONPATH": str(ROOT),
        "IW_INGRESS_WEBHOOK_QUEUE": "t.hooks",
        "IW_INGRESS_EMAIL_QUEUE": "t.emails",
        "IW_WEBHOOK_SECRETS_KEY": KEY,
    }


@pytest.fixture
async def serving(db: DbConnection, env: dict[str, str], tmp_path: Path) -> AsyncIterator[Serving]:
    key = cli(env, "api-key", "create", "--tenant", "acme").stdout.strip()
    assert key.startswith("iwk_")
    async with started(env, tmp_path / "serve.log", "consumers", "serve") as url:
        yield Serving(url=url, key=key)


async def test_the_bench_endpoint_is_the_benchs_not_the_products(
    serving: Serving, env: dict[str, str], tmp_path: Path
) -> None:
    """The product answers 404 on /bench/trivial; the bench's server mounts it itself."""
    async with (
        started(env, tmp_path / "bench.log", "proving.bench.ingress_serve") as bench_url,
        httpx.AsyncClient(timeout=30) as http,
    ):
        product = await http.post(f"{serving.url}/bench/trivial", content=b"{}")
        bench = await http.post(f"{bench_url}/bench/trivial", content=b"{}")
        sent = await http.post(
            f"{bench_url}/v1/messages",
            json={**JOB, "idempotency_key": "bench-1"},
            headers={"Authorization": f"Bearer {serving.key}"},
        )
    assert product.status_code == 404
    assert (bench.status_code, bench.json()) == (202, {"status": "queued", "id": "trivial"})
    assert sent.status_code == 202  # the bench's server is the product plus one route


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


# Each run its own tenant: a key is the tenant's across kinds (the same key for a push
# and then a webhook is 422), and the generator draws the same few keys for every route.
SCHEMATHESIS_RUNS = {
    "push": "^/v1/messages",
    "webhooks": "^/v1/webhook",
    "emails": "^/v1/(emails$|messages/)",  # with GET and cancel, which its answer links to
}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("routes", sorted(SCHEMATHESIS_RUNS))
def test_schemathesis_finds_no_failure_against_the_live_openapi(
    serving: Serving, env: dict[str, str], routes: str
) -> None:
    """`st run` with every check against serve's own /openapi.json, bounded in examples."""
    key = cli(env, "api-key", "create", "--tenant", f"st-{routes}").stdout.strip()
    st = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [
            str(st),
            "--config-file",
            str(ROOT / "tests" / "schemathesis.toml"),
            "run",
            f"{serving.url}/openapi.json",
            "--include-path-regex",
            SCHEMATHESIS_RUNS[routes],
            "--checks",
            "all",
            "--max-examples",
            "25",
            "--header",
            f"Authorization: Bearer {key}",
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
    assert "No issues found" in result.stdout, result.stdout[-6000:]


async def test_the_servers_socket_accepts_a_connect_before_uvicorn_has_started() -> None:
    """`serve` and `console` print their port once this socket is made: a connect then
    waits in its backlog, however late uvicorn starts (here: never)."""
    with listening_socket("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), ANSWER_S)
        writer.close()
        await writer.wait_closed()
