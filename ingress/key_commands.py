"""`idempotent-workers api-key create --tenant T | list | revoke HASH_PREFIX`.

create   makes a key for a tenant and prints it: the only time it is shown
list     one line a key: the start of its hash, tenant, created, last used
revoke   deletes the key whose hash starts so (as `list` shows it); a
         running `serve` refuses it once its key cache forgets it, within
         IW_INGRESS_KEY_CACHE_SECONDS
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

import asyncpg

from consumers import Settings
from dedupe import DbConnection, check_schema
from ingress.keys import AmbiguousPrefix, ApiKeys

T = TypeVar("T")


def api_key_parser() -> argparse.ArgumentParser:
    """The flags of `api-key` and of each of its actions."""
    parser = argparse.ArgumentParser(
        prog="idempotent-workers api-key",
        description="The send API's keys, in DATABASE_URL's schema: create one for a tenant,"
        " list them, revoke one.",
    )
    sub = parser.add_subparsers(dest="action", required=True, help="ACTION --help: its flags")
    said = "make a key for a tenant and print it: the only time it is shown"
    create = sub.add_parser("create", help=said, description=said)
    create.add_argument("--tenant", required=True, help="the tenant the key's jobs belong to")
    said = "every key: the start of its hash, tenant, created, last used"
    sub.add_parser("list", help=said, description=said)
    said = (
        "delete the key whose hash starts with HASH_PREFIX (as list shows it); a running"
        " serve refuses it within IW_INGRESS_KEY_CACHE_SECONDS"
    )
    revoke = sub.add_parser("revoke", help=said, description=said)
    revoke.add_argument("hash_prefix", metavar="HASH_PREFIX", help="the start of the key's hash")
    return parser


def api_key_main(argv: Sequence[str], settings: Settings) -> int:
    args = api_key_parser().parse_args(argv)
    keys = ApiKeys(settings.database.schema)
    if args.action == "create":
        print(asyncio.run(_with(settings, lambda conn: keys.create(conn, args.tenant))))
        return 0
    if args.action == "list":
        print(f"{'hash':<14}{'tenant':<24}{'created':<27}last used")
        for row in asyncio.run(_with(settings, keys.list)):
            print(
                f"{row.hash_prefix:<14}{row.tenant!r:<24}{_when(row.created_at):<27}"
                f"{_when(row.last_used_at)}"
            )
        return 0
    try:
        gone = asyncio.run(_with(settings, lambda conn: keys.revoke(conn, args.hash_prefix)))
    except AmbiguousPrefix as exc:
        print(f"api-key revoke: {exc}: give more of the hash")
        return 1
    if gone is None:
        print(f"api-key revoke: no key's hash starts with {args.hash_prefix!r}")
        return 1
    print(f"revoked {gone.hash_prefix} of tenant {gone.tenant!r}")
    return 0


def _when(moment: datetime | None) -> str:
    return "never" if moment is None else moment.isoformat(timespec="seconds")


async def _with(settings: Settings, work: Callable[[DbConnection], Awaitable[T]]) -> T:
    conn = await asyncpg.connect(settings.database.url)
    try:
        await check_schema(conn, settings.database.schema)
        return await work(conn)
    finally:
        await conn.close()
