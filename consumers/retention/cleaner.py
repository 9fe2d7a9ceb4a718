"""Retention cleanup: the `cleanup` command, and the periodic one inside `run`.

Both go through `dedupe.cleanup` (every table that grows with traffic rotates
and leaves by whole generations, never by DELETE), one cleaner per schema at a time (an
advisory lock): a second one says so and returns. A retention shorter than
the retry horizon plus the replay window (`consumers.retention.retry_horizon`) is refused:
by `cleanup` for its `--keep-days`, by `run` before it starts.
The periodic cleaner is opt-in (`IW_CLEANUP_INTERVAL` seconds); with many
workers, each tries at its interval and all but one find the lock taken.
Its failures are logged, never raised: a worker does not stop for them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from datetime import timedelta
from typing import Any

import asyncpg
import structlog

from consumers.handlers.loading import load_app
from consumers.handlers.retry import RetryPolicy
from consumers.retention.retry_horizon import check_retention, retention_need
from consumers.settings import Settings
from dedupe import CleanerBusy, CleanupResult, Retention, cleanup

log = structlog.get_logger(__name__)


def register(sub: Any) -> None:
    """Add `cleanup` to the CLI's subcommands."""
    said = (
        "rotate the dedupe tables' generations and drop those past retention (no DELETE),"
        " one cleaner per schema at a time"
    )
    clean = sub.add_parser("cleanup", help=said, description=said)
    clean.add_argument(
        "--keep-days", type=float, default=None, help="default: IW_RETENTION_DAYS (7)"
    )
    clean.add_argument(
        "--app", metavar="MODULE:APP", help="check --keep-days against this app's retry policies"
    )
    clean.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="look for --app's module in DIR first (default: the working directory)",
    )
    clean.add_argument(
        "--wait", action="store_true", help="wait for a running cleaner instead of exiting"
    )


async def run(args: argparse.Namespace, settings: Settings) -> int:
    keep_days = settings.retention.keep_days if args.keep_days is None else args.keep_days
    keep = timedelta(days=keep_days)
    specs = load_app(args.app, app_dir=args.app_dir).specs if args.app else {}
    need = retention_need(specs, settings.retention, RetryPolicy())
    check_retention(keep, need, setting="--keep-days")
    retention = Retention(keep=keep, rotate_every=settings.retention.generation_span)
    schema = settings.database.schema
    conn = await asyncpg.connect(settings.database.url)
    try:
        result = await cleanup(
            conn,
            schema,
            retention,
            progress=lambda r: print(
                f"cleanup: generations dropped so far: {r.generations_dropped}"
                f" (rows: processed_messages={r.processed_messages} send_ledger={r.send_ledger}"
                f" outbox={r.outbox} ingress_keys={r.ingress_keys}"
                f" ingress_messages={r.ingress_messages}; moved={r.moved})",
                flush=True,
            ),
            wait=args.wait,
        )
    except CleanerBusy as exc:
        print(f"cleanup: schema={schema} not run: {exc} (--wait to wait for it)")
        return 0
    finally:
        await conn.close()
    print(
        f"cleanup: schema={schema} older_than={keep_days}d"
        f" processed_messages={result.processed_messages}"
        f" generations_dropped={result.generations_dropped} generation={result.generation}"
        f" send_ledger={result.send_ledger} outbox={result.outbox}"
        f" ingress_keys={result.ingress_keys} ingress_messages={result.ingress_messages}"
        f" moved={result.moved}"
    )
    return 0


async def clean_periodically(settings: Settings) -> None:
    """Every `cleanup_interval_seconds` (with jitter), one cleanup run; until cancelled."""
    interval = settings.retention.cleanup_interval_seconds
    assert interval is not None and interval > 0
    retention = Retention(
        keep=settings.retention.keep, rotate_every=settings.retention.generation_span
    )
    while True:
        await asyncio.sleep(interval * random.uniform(0.75, 1.0))
        try:
            result = await _clean_once(settings, retention)
        except CleanerBusy:
            log.info("cleanup_skipped", reason="another cleaner is running")
        except Exception as exc:  # the database is away, say: try again next time
            log.warning("cleanup_failed", error=f"{type(exc).__name__}: {exc}")
        else:
            log.info(
                "cleanup_done",
                processed_messages=result.processed_messages,
                generations_dropped=result.generations_dropped,
                generation=result.generation,
                rotated=result.rotated,
                send_ledger=result.send_ledger,
                outbox=result.outbox,
                ingress_keys=result.ingress_keys,
                ingress_messages=result.ingress_messages,
                moved=result.moved,
            )


async def _clean_once(settings: Settings, retention: Retention) -> CleanupResult:
    conn = await asyncpg.connect(settings.database.url)
    try:
        return await cleanup(conn, settings.database.schema, retention)
    finally:
        await conn.close()
