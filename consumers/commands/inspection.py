"""`idempotent-workers inspect [--tenant T] CONSUMER MESSAGE_ID`: one key's whole story.

    claim       when it was claimed and the fingerprint of the body that won
    ledger      each target of an external effect: status, sends, provider id, lease
    outbox      rows publishing this key to this queue (if the outbox exists)
    api         the send API's message and idempotency key rows of an `ingress-` job
    dlq         copies in `<CONSUMER>.dlq` with this message_id and tenant

A MESSAGE_ID (and a tenant) may be given as `dlq list` prints it
(`order-\\x00-1`, `-`). One that is not UTF-8 (bytes pasted from elsewhere)
is not looked up in the database, which cannot hold it: it is said so.

The database is only read. The dead-letter queue is read as `dlq list` reads
it (`consumers.commands.deadletters`): a consumer that never acks, then the channel
closed, so every message read goes back in place; on RabbitMQ 3.x each one
read (not only the copies found) counts one delivery more in its
`x-delivery-count`. `--no-dlq` skips it. Everything printed is escaped and
device tokens and e-mail addresses are cut short (`consumers.jobs.kind.shown_address`).
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Mapping
from typing import Any

import asyncpg

from consumers.broker.connection import connect_once
from consumers.commands.deadletters import DeadLetter, NoSuchQueue, read_dead_letters
from consumers.commands.printable import printable
from consumers.handlers.retry import dead_letter_queue
from consumers.jobs.kind import shown_address
from consumers.message.envelope import is_text
from consumers.settings import Settings
from dedupe import DedupeKey, KeyRecord, look_up


def register(sub: Any) -> None:
    """Add `inspect` to the CLI's subcommands."""
    said = "what happened to one message: its claim, ledger, outbox rows and dead letters"
    parser = sub.add_parser("inspect", help=said, description=said)
    parser.add_argument("consumer", help="the consumer (its queue's name)")
    parser.add_argument("message_id", help="as published, or as dlq list prints it")
    parser.add_argument("--tenant", default="", help="the x-tenant header (default: none)")
    parser.add_argument("--no-dlq", action="store_true", help="do not read the dead-letter queue")
    parser.add_argument("--scan", type=int, default=10_000, help="dead letters read at most")


async def run(args: argparse.Namespace, settings: Settings) -> int:
    key = DedupeKey(consumer=args.consumer, tenant=args.tenant, message_id=args.message_id)
    print(
        f"key: consumer={printable(key.consumer)} tenant={printable(key.tenant) or '(none)'}"
        f" message_id={printable(key.message_id)}"
    )
    found = False
    if all(is_text(part) for part in (key.consumer, key.tenant, key.message_id)):
        conn = await asyncpg.connect(settings.database.url)
        try:
            record = await look_up(conn, settings.database.schema, key)
        finally:
            await conn.close()
        _print_record(record)
        found = record.found
    else:  # argv read with surrogateescape: bytes no claim can hold
        print("claim: none (a key that is not UTF-8 is never claimed; not looked up)")
    copies = 0
    if args.no_dlq:
        print("dlq: not read (--no-dlq)")
    elif not is_text(key.consumer):
        print("dlq: not read (a consumer name that is not UTF-8 names no queue)")
    else:
        copies = await _print_dead_letters(settings, key, args.scan)
    return 0 if found or copies else 1


def _print_record(record: KeyRecord) -> None:
    claim = record.claim
    if claim is None:
        print("claim: none (never committed, or deleted by retention)")
    else:
        when = claim.processed_at.isoformat()
        print(f"claim: processed_at={when} fingerprint={claim.fingerprint.hex()}")
    print(f"ledger: {len(record.sends)} row(s)")
    for row in record.sends:
        print("  " + _fields(row, token=True))
    if record.outbox is None:
        print("outbox: no outbox table in this schema")
    else:
        print(f"outbox: {len(record.outbox)} row(s)")
        for row in record.outbox:
            print("  " + _fields(row, token=False))
    if record.api_message is not None:
        print("api message: " + _fields(record.api_message, token=False))
        key = "none" if record.api_key is None else _fields(record.api_key, token=False)
        print(f"api key: {key}")


def _fields(row: Mapping[str, object], *, token: bool) -> str:
    parts = []
    for name, value in row.items():
        if value is None:
            continue
        if token and name == "address":
            value = shown_address(str(row.get("channel")), str(value))
        if isinstance(value, datetime.datetime):
            value = value.isoformat()
        parts.append(f"{name}={printable(str(value))}")
    return " ".join(parts)


async def _print_dead_letters(settings: Settings, key: DedupeKey, scan: int) -> int:
    dlq = dead_letter_queue(key.consumer)
    try:
        connection = await connect_once(settings.amqp.urls)
    except Exception as exc:  # the database part is printed already: say why this is missing
        print(f"dlq: not read: {printable(repr(exc))}")
        return 0
    try:
        channel = await connection.channel()
        try:
            letters, held = await read_dead_letters(channel, dlq, most=scan)
        except NoSuchQueue:
            print(f"dlq: no queue {printable(dlq)}")
            return 0
        finally:
            await channel.close()  # every message read goes back, unacked
    finally:
        await connection.close()
    copies = [letter for letter in letters if _is_copy(letter, key)]
    unread = held - len(letters)
    print(
        f"dlq: {printable(dlq)} held={held} read={len(letters)} copies={len(copies)}"
        + (f" unread={unread} (past --scan)" if unread > 0 else "")
    )
    now = datetime.datetime.now(datetime.UTC)
    for letter in copies:
        age = letter.age(now)
        told = "?" if age is None else f"{age.total_seconds() / 3600:.1f}h"
        print(
            f"  reason={printable(letter.reason)} attempt={letter.attempt} age={told}"
            f" error={printable(letter.error)}"
        )
    return len(copies)


def _is_copy(letter: DeadLetter, key: DedupeKey) -> bool:
    return letter.is_named(key.message_id) and key.tenant in (
        letter.tenant,
        printable(letter.tenant),
    )
