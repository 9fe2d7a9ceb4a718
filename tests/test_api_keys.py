"""API keys for operators: list, revoke (refused within the cache time), wrong keys remembered."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import asyncpg
import httpx
import pytest

from consumers import Settings
from dedupe import DbConnection
from ingress.keys import ApiKeys, key_hash
from ingress.settings import IngressSettings
from tests.conftest import DATABASE_URL
from tests.ingress_support import serve_in_process
from tests.support import ROOT

JOB = {"targets": [{"platform": "ios", "token": "ios-token-1"}]}
CACHE_S = 1.0


def api_key(schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": DATABASE_URL, "DATABASE_SCHEMA": schema}
    return subprocess.run(
        [sys.executable, "-m", "consumers", "api-key", *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_list_shows_each_keys_hash_prefix_tenant_created_and_last_use(
    db: DbConnection, schema: str, settings: Settings
) -> None:
    made = api_key(schema, "create", "--tenant", "acme")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    before = api_key(schema, "list").stdout.splitlines()
    assert len(before) == 2  # the heading and one key
    assert before[1].startswith(key_hash(key).hex()[:12])
    assert "'acme'" in before[1] and before[1].endswith("never")
    assert key not in "".join(before)  # the key itself is never shown again
    async with (
        serve_in_process(db, settings.database, IngressSettings(queue="t.keys")) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as http,
    ):
        sent = await http.post(
            "/v1/messages",
            json={**JOB, "idempotency_key": "k"},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert sent.status_code == 202
    used = [line for line in api_key(schema, "list").stdout.splitlines() if "'acme'" in line]
    assert len(used) == 2  # serve_in_process made one of its own for acme
    assert sum(not line.endswith("never") for line in used) == 1


async def test_a_revoked_key_is_refused_within_the_key_cache_time(
    db: DbConnection, schema: str, settings: Settings
) -> None:
    ingress = IngressSettings(queue="t.keys", key_cache_seconds=CACHE_S)
    async with (
        serve_in_process(db, settings.database, ingress) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as http,
    ):
        auth = {"Authorization": f"Bearer {served.key}"}
        loop = asyncio.get_running_loop()
        first = await http.post("/v1/messages", json={**JOB, "idempotency_key": "a"}, headers=auth)
        cached_by = loop.time()  # the key was read, and cached for CACHE_S, before this
        assert first.status_code == 202
        revoked = api_key(schema, "revoke", key_hash(served.key).hex()[:12])
        assert revoked.returncode == 0, revoked.stdout + revoked.stderr
        deadline = loop.time() + CACHE_S + 10  # the 10 s: a busy machine's request time
        admitted_last = cached_by
        while True:
            started = loop.time()
            if (await http.get("/v1/messages/x", headers=auth)).status_code == 401:
                break
            admitted_last = started
            assert loop.time() < deadline, "the revoked key still works past the cache time"
            await asyncio.sleep(0.05)
    # Every request that started past the cache time read the key again and found it revoked.
    assert admitted_last <= cached_by + CACHE_S, admitted_last - cached_by
    assert "no key" in api_key(schema, "revoke", key_hash(served.key).hex()[:12]).stdout
    assert api_key(schema, "revoke", "zz").returncode == 1


async def test_a_wrong_key_costs_one_query_per_bad_key_time_not_one_per_request(
    db: DbConnection, schema: str
) -> None:
    queries: list[str] = []

    async def watch(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: queries.append(record.query))

    pool = await asyncpg.create_pool(DATABASE_URL, min_size=1, max_size=1, init=watch)
    try:
        keys = ApiKeys(schema, bad_key_seconds=60)
        answers = [await keys.tenant_for(pool, "iwk_made-up") for _ in range(50)]
    finally:
        await pool.close()
    assert answers == [None] * 50
    assert len([q for q in queries if "ingress_api_keys" in q]) == 1


@pytest.mark.parametrize("seconds", ["2.5"])
def test_the_key_cache_times_are_settings(seconds: str) -> None:
    env = {"IW_INGRESS_KEY_CACHE_SECONDS": seconds, "IW_INGRESS_BAD_KEY_SECONDS": seconds}
    ingress = IngressSettings.from_env(env)
    assert ingress.key_cache_seconds == ingress.bad_key_seconds == float(seconds)
