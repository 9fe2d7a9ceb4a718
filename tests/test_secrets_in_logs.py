"""Passwords never reach a log line, whatever is wrong with the configuration.

Each case starts real processes with a password in AMQP_URL or DATABASE_URL
and something wrong (a refused password, a port nobody listens on, a host
that does not resolve, TLS spoken to a plain port), lets them fail, and
reads every byte they wrote. The password holds a percent-encoded `/`, so
both the URL's form and the decoded one are looked for, and its first half
too (a password cut at the `/` is still a leak).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import asyncpg
import pytest

from dedupe import DbConnection
from proving.chaos.services import PrivatePostgres, free_port, remove_tree
from tests.conftest import Spawn
from tests.support import ROOT, WorkerProcess, wait_for

SECRET = "Xq7-s3cret%2Fpw"
LEAKS = ("Xq7-s3cret%2Fpw", "Xq7-s3cret/pw", "Xq7-s3cret")
CLOSED = free_port()  # bound once and released: nothing listens there

AMQP_CASES = {
    "amqp_bad_password": f"amqp://guest:{SECRET}@127.0.0.1:5672/",
    "amqp_unreachable_port": f"amqp://guest:{SECRET}@127.0.0.1:{CLOSED}/",
    "amqp_unknown_host": f"amqp://guest:{SECRET}@no-such-host.invalid:5672/",
    "amqps_to_a_plain_port": f"amqps://guest:{SECRET}@127.0.0.1:5672/",
    "amqp_cluster_none_answers": (
        f"amqp://guest:{SECRET}@127.0.0.1:{CLOSED}/,amqp://guest:{SECRET}@127.0.0.1:5672/"
    ),
}
DATABASE_CASES = {
    "postgres_unreachable_port": f"postgresql://postgres:{SECRET}@127.0.0.1:{CLOSED}/postgres",
    "postgres_unknown_host": f"postgresql://postgres:{SECRET}@no-such-host.invalid/postgres",
}


def assert_no_password(text: str, what: str) -> None:
    assert text.strip(), f"{what} wrote nothing: nothing was checked"
    for leak in LEAKS:
        assert leak not in text, f"{what} leaked the password ({leak!r}):\n{text}"


async def fail_and_read(worker: WorkerProcess) -> str:
    """Wait until the worker exits or has logged a failure, stop it, return its log."""

    async def failed() -> bool:
        text = worker.log_text()
        return worker.proc.poll() is not None or '"level":"warning"' in text or "rror" in text

    await wait_for(failed, timeout=90)
    if worker.proc.poll() is None:
        await asyncio.sleep(1.0)  # let a retry loop log a second round too
        worker.terminate()
    await worker.wait(timeout=60)
    return worker.log_text()


def cli(*args: str, env: Mapping[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "consumers", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0, f"{args} did not fail: {done.stdout}"
    return done.stdout + done.stderr


@pytest.mark.parametrize("case", sorted(AMQP_CASES))
async def test_a_failing_broker_configuration_never_logs_the_password(
    case: str, db: DbConnection, spawn: Spawn, queue_name: str
) -> None:
    env = {"AMQP_URL": AMQP_CASES[case]}
    assert_no_password(await fail_and_read(spawn(env)), f"run ({case})")
    assert_no_password(cli("dlq", "list", queue_name, env=env), f"dlq list ({case})")


async def test_a_supervisor_and_its_children_never_log_the_password(
    db: DbConnection, spawn: Spawn
) -> None:
    env = {"AMQP_URL": AMQP_CASES["amqp_bad_password"]}
    supervised = spawn(env, args=["--processes", "2", "--max-restarts", "1"])
    assert_no_password(await fail_and_read(supervised), "run --processes 2 (amqp_bad_password)")


@pytest.mark.parametrize("case", sorted(DATABASE_CASES))
async def test_a_failing_database_configuration_never_logs_the_password(
    case: str, spawn: Spawn
) -> None:
    env = {"DATABASE_URL": DATABASE_CASES[case]}
    assert_no_password(await fail_and_read(spawn(env)), f"run ({case})")
    assert_no_password(cli("migrate", env=env), f"migrate ({case})")


@pytest.fixture
async def password_postgres() -> AsyncIterator[str]:
    """A private PostgreSQL that checks passwords (the shared one trusts every local login)."""
    workdir = Path(tempfile.mkdtemp(prefix="iw-secrets-"))
    os.chmod(workdir, 0o755)  # the private PostgreSQL runs as the postgres user
    port = free_port()
    postgres = PrivatePostgres(workdir / "pg", port)
    try:
        await asyncio.to_thread(postgres.init)
        await postgres.start()
        admin = await asyncpg.connect(postgres.url)
        try:
            await admin.execute("CREATE ROLE worker LOGIN PASSWORD 'the-right-one'")
            (postgres.data / "pg_hba.conf").write_text(
                "local all all trust\n"
                "host all postgres 127.0.0.1/32 trust\n"
                "host all all 127.0.0.1/32 scram-sha-256\n"
            )
            await admin.execute("SELECT pg_reload_conf()")
        finally:
            await admin.close()
        yield f"postgresql://worker:{SECRET}@127.0.0.1:{port}/postgres"
    finally:
        await postgres.stop()
        remove_tree(workdir)


async def test_a_refused_database_password_is_never_logged(
    password_postgres: str, spawn: Spawn, queue_name: str
) -> None:
    with pytest.raises(asyncpg.InvalidPasswordError):  # the case is what it says
        await asyncpg.connect(password_postgres)
    env = {"DATABASE_URL": password_postgres}
    assert_no_password(await fail_and_read(spawn(env)), "run (postgres_bad_password)")
    for command in (["migrate"], ["cleanup"], ["inspect", queue_name, "m-1", "--no-dlq"]):
        assert_no_password(cli(*command, env=env), f"{command[0]} (postgres_bad_password)")
