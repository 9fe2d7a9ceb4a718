"""Retention deletes old claims and settled sends in batches, and nothing it must keep."""

from __future__ import annotations

import subprocess
import sys

from dedupe import DbConnection, Retention, cleanup
from tests.conftest import DATABASE_URL
from tests.support import ROOT


async def _seed(db: DbConnection) -> None:
    await db.execute(
        "INSERT INTO processed_messages (consumer, tenant, message_id, fingerprint, processed_at)"
        " SELECT 'q', '', 'old-' || n, '\\x00', now() - interval '8 days'"
        " FROM generate_series(1, 25) n"
    )
    await db.execute(
        "INSERT INTO processed_messages (consumer, tenant, message_id, fingerprint)"
        " SELECT 'q', '', 'new-' || n, '\\x00' FROM generate_series(1, 5) n"
    )
    # An old push job with one device still unsettled: it keeps its claim and that row.
    await db.execute(
        "INSERT INTO processed_messages (consumer, tenant, message_id, fingerprint, processed_at)"
        " VALUES ('p', '', 'push-old', '\\x00', now() - interval '8 days')"
    )
    await db.execute(
        "INSERT INTO outbound_sends (consumer, tenant, message_id, target_index, platform, token,"
        " apns_id, collapse_id, status, created_at) VALUES"
        " ('p', '', 'push-old', 0, 'ios', 't0', gen_random_uuid(), 'c', 'sent',"
        "  now() - interval '8 days'),"
        " ('p', '', 'push-old', 1, 'ios', 't1', gen_random_uuid(), 'c', 'claimed',"
        "  now() - interval '8 days')"
    )


async def test_cleanup_deletes_expired_rows_in_batches_and_keeps_the_rest(
    db: DbConnection, schema: str
) -> None:
    await _seed(db)
    seen = []
    result = await cleanup(db, schema, Retention(batch_size=10), progress=lambda r: seen.append(r))
    assert result.processed_messages == 25
    assert result.outbound_sends == 1
    assert len(seen) >= 3  # 25 claims at 10 a batch took several statements
    left = await db.fetch("SELECT message_id FROM processed_messages ORDER BY message_id")
    assert [r["message_id"] for r in left] == [f"new-{n}" for n in (1, 2, 3, 4, 5)] + ["push-old"]
    statuses = await db.fetch("SELECT status FROM outbound_sends")
    assert [r["status"] for r in statuses] == ["claimed"]


async def test_cleanup_command_reports_what_it_deleted(db: DbConnection, schema: str) -> None:
    await _seed(db)
    done = subprocess.run(
        [sys.executable, "-m", "consumers", "cleanup", "--keep-days", "7", "--batch-size", "7"],
        env={"DATABASE_URL": DATABASE_URL, "DATABASE_SCHEMA": schema, "PATH": "/usr/bin"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"cleanup: schema={schema} older_than=7.0d processed_messages=25 outbound_sends=1" in (
        done.stdout
    )
