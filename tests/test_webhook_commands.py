"""`idempotent-workers webhook endpoint ...` as an operator runs it, and a worker without
the key: a secret is printed whole once, by the command that made it, and never again.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dedupe import DbConnection
from tests.support import ROOT, WorkerProcess
from tests.webhook_support import KEY

RUN_S = 60.0  # one command against the local PostgreSQL; this bounds a hang


async def cli(schema: str, *args: str, key: str = KEY) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_SCHEMA": schema,
        "IW_WEBHOOK_SECRETS_KEY": key,
        "IW_WEBHOOK_ALLOW_HTTP_HOSTS": "127.0.0.1",
    }
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "consumers", "webhook", "endpoint", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )


def said(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


async def test_a_secret_is_shown_once_and_afterwards_only_by_its_prefix(
    db: DbConnection, schema: str
) -> None:
    added = await cli(
        schema,
        "add",
        "--tenant",
        "acme",
        "--url",
        "https://hooks.example/in",
        "--event-type",
        "order.shipped",
    )
    assert added.returncode == 0, said(added)
    endpoint_id = added.stdout.split()[0]
    [secret] = [w for w in added.stdout.split() if w.startswith("whsec_")]
    assert said(added).count(secret) == 1
    stored = await db.fetchval("SELECT ciphertext FROM webhook_secrets")
    assert secret.encode() not in bytes(stored) and secret[6:].encode() not in bytes(stored)

    listed = await cli(schema, "list", "--tenant", "acme")
    assert listed.returncode == 0 and f"{secret[:10]}…" in listed.stdout, said(listed)
    rotated = await cli(schema, "rotate", endpoint_id, "--overlap-hours", "2")
    assert rotated.returncode == 0, said(rotated)
    [newer] = [w for w in rotated.stdout.split() if w.startswith("whsec_")]
    after = [
        listed,
        rotated,
        await cli(schema, "list"),
        await cli(schema, "disable", endpoint_id),
        await cli(schema, "enable", endpoint_id),
    ]
    for done in after:
        assert done.returncode == 0, said(done)
        assert secret[10:] not in said(done), said(done)  # nothing past the prefix, ever
    assert said(after[2]).count(newer[:10]) == 1 and newer[10:] not in said(after[2])
    assert "expires" in after[2].stdout  # the old secret signs beside the new one a while
    removed = await cli(schema, "remove", endpoint_id)
    assert (
        removed.returncode == 0 and await db.fetchval("SELECT count(*) FROM webhook_secrets") == 0
    )


async def test_the_commands_refuse_what_they_cannot_keep(db: DbConnection, schema: str) -> None:
    keyless = await cli(schema, "add", "--tenant", "acme", "--url", "https://x.example/", key="")
    assert keyless.returncode == 78 and "IW_WEBHOOK_SECRETS_KEY is not set" in keyless.stderr
    plain = await cli(schema, "add", "--tenant", "acme", "--url", "http://x.example/")
    assert plain.returncode == 2 and "https only" in plain.stderr
    local = await cli(schema, "add", "--tenant", "acme", "--url", "http://127.0.0.1:9/in")
    assert local.returncode == 0, said(local)  # IW_WEBHOOK_ALLOW_HTTP_HOSTS
    bad_type = await cli(
        schema, "add", "--tenant", "a", "--url", "https://x.example/", "--event-type", "a b"
    )
    assert bad_type.returncode == 2
    missing = await cli(schema, "disable", "ep_nonesuch")
    assert missing.returncode == 1 and "no enabled endpoint" in missing.stderr
    assert await db.fetchval("SELECT count(*) FROM webhook_endpoints") == 1


@pytest.mark.parametrize("key", ["", "not-a-fernet-key"])
async def test_a_worker_without_a_usable_key_refuses_to_start(
    db: DbConnection, worker_env: dict[str, str], tmp_path: Path, key: str
) -> None:
    worker = WorkerProcess(
        "tests.apps.webhook_app:app",
        {**worker_env, "IW_WEBHOOK_SECRETS_KEY": key},
        tmp_path / "keyless.log",
    )
    try:
        await worker.expect_exit(78)
    finally:
        worker.stop_now()
    [line] = worker.events("start_failed")
    assert line["error"] == "configuration" and "IW_WEBHOOK_SECRETS_KEY" in line["detail"]
    assert "Traceback" not in worker.log_text()
    if key:
        assert key not in line["detail"]
