"""`idempotent-workers dlq list|show|replay|archive QUEUE`: the commands and what they print.

QUEUE is the work queue (`orders`) or its dead-letter queue (`orders.dlq`).
Everything printed that came from a message goes through `printable()`: no
escape sequence, NUL or bidi override reaches the terminal raw. `show` takes
a message_id as typed or as `list` prints it, and shows any body the worker
dead-letters: one the JSON reader cannot indent (nested past its recursion
limit, not JSON, not UTF-8) is printed as received.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Mapping
from typing import Any

import aio_pika
import asyncpg

from consumers.broker.connection import connect_once
from consumers.commands.archive import archive
from consumers.commands.deadletters import DeadLetter, NoSuchQueue, read_dead_letters, work_queue_of
from consumers.commands.printable import printable
from consumers.commands.replay import Outcome, Replayed, Selection, database_claims, replay
from consumers.handlers.retry import dead_letter_queue
from consumers.settings import Settings
from dedupe import SchemaMissing, check_schema

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since(text: str) -> datetime.datetime:
    """`2h`, `30m`, `7d`, `90s` ago, or an ISO 8601 time (UTC unless it says otherwise)."""
    now = datetime.datetime.now(datetime.UTC)
    found = _DURATION.match(text)
    if found:
        return now - datetime.timedelta(seconds=float(found[1]) * _UNITS[found[2]])
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected 2h, 30m, 7d or an ISO time, got {text!r}"
        ) from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def register(sub: Any) -> None:
    """Add `dlq` to the CLI's subcommands."""
    dlq = sub.add_parser("dlq", help="list, show or replay dead letters")
    actions = dlq.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="one line per dead letter, without removing any")
    show = actions.add_parser("show", help="every copy of one message, whole")
    again = actions.add_parser("replay", help="back to the work queue the DLQ belongs to")
    gone = actions.add_parser("archive", help="take chosen dead letters out of the DLQ for good")
    for parser in (listing, show, again, gone):
        parser.add_argument("queue", help="the work queue, or its dead-letter queue")
        parser.add_argument(
            "--scan", type=int, default=10_000, help="read at most this many dead letters"
        )
    show.add_argument("message_id")
    for parser in (listing, again, gone):
        parser.add_argument("--reason", help="a pattern: max_attempts_exceeded:*")
        parser.add_argument("--message-id")
        parser.add_argument("--tenant", help="the x-tenant header ('' for none)")
        parser.add_argument("--since", type=since, help="first dead-lettered since: 2h, 7d, ISO")
        parser.add_argument("--limit", type=int, default=100)
    again.add_argument("--dry-run", action="store_true", help="say what would be replayed")
    again.add_argument(
        "--force", action="store_true", help="replay even what is older than retention"
    )
    gone.add_argument("--yes", action="store_true", help="required: the messages are deleted")


async def run(args: argparse.Namespace, settings: Settings) -> int:
    queue = work_queue_of(args.queue)
    connection = await connect_once(settings.amqp.urls)
    try:
        if args.action == "replay":
            return await _replay(connection, queue, args, settings)
        if args.action == "archive":
            return await _archive(connection, queue, args)
        channel = await connection.channel()
        try:
            letters, held = await read_dead_letters(
                channel, dead_letter_queue(queue), most=args.scan
            )
            if args.action == "show":
                return _show(queue, [x for x in letters if x.is_named(args.message_id)])
            return _list(queue, letters, held, _selection(args))
        finally:
            await channel.close()  # every message read goes back, unacked
    except NoSuchQueue as exc:
        print(f"idempotent-workers: no queue {printable(str(exc))} on the broker")
        return 2
    finally:
        await connection.close()


def _selection(args: argparse.Namespace) -> Selection:
    return Selection(
        reason=args.reason,
        message_id=args.message_id,
        tenant=args.tenant,
        since=args.since,
        limit=args.limit,
    )


def _age(letter: DeadLetter, now: datetime.datetime) -> str:
    age = letter.age(now)
    if age is None:
        return "?"
    seconds = age.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _list(queue: str, letters: list[DeadLetter], held: int, selection: Selection) -> int:
    now = datetime.datetime.now(datetime.UTC)
    chosen = [letter for letter in letters if selection.matches(letter)][: selection.limit]
    print(f"{'message_id':<40} {'reason':<40} {'attempt':>7} {'age':>6} error")
    for letter in chosen:
        error = printable(letter.error)
        print(
            f"{printable(letter.message_id):<40} {printable(letter.reason):<40}"
            f" {letter.attempt:>7} {_age(letter, now):>6} {error[:80]}"
        )
    print(
        f"dlq: queue={printable(dead_letter_queue(queue))} held={held} read={len(letters)}"
        f" listed={len(chosen)}"
    )
    return 0


def _show(queue: str, copies: list[DeadLetter]) -> int:
    if not copies:
        print(f"dlq: queue={printable(dead_letter_queue(queue))} no such message_id")
        return 1
    for number, letter in enumerate(copies, 1):
        message = letter.message
        print(f"copy {number} of {len(copies)}")
        print("properties:")
        for name in (
            "message_id",
            "content_type",
            "content_encoding",
            "correlation_id",
            "type",
            "timestamp",
            "delivery_mode",
            "priority",
            "app_id",
            "user_id",
            "reply_to",
            "expiration",
            "redelivered",
        ):
            value = getattr(message, name, None)
            if value is not None:
                print(f"  {name}: {printable(str(value))}")
        print("headers:")
        for line in _tree(message.headers or {}, "  "):
            print(line)
        print(f"body ({len(message.body)} bytes):")
        print(_body(message.body))
    return 0


def _tree(headers: Mapping[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    for name in sorted(headers):
        value = headers[name]
        if isinstance(value, Mapping):
            lines.append(f"{indent}{printable(name)}:")
            lines.extend(_tree(value, indent + "  "))
        elif isinstance(value, list):
            lines.append(f"{indent}{printable(name)}:")
            for item in value:
                if isinstance(item, Mapping):
                    lines.append(f"{indent}  -")
                    lines.extend(_tree(item, indent + "    "))
                else:
                    lines.append(f"{indent}  - {_scalar(item)}")
        else:
            lines.append(f"{indent}{printable(name)}: {_scalar(value)}")
    return lines


def _scalar(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return f"(bytes, not UTF-8) {printable(value)}"
    return printable(str(value))


def _body(body: bytes) -> str:
    try:
        return printable(json.dumps(json.loads(body), indent=2, ensure_ascii=False))
    except (ValueError, RecursionError):  # RecursionError: `json_too_deep`, say
        return printable(body)


async def _replay(
    connection: aio_pika.abc.AbstractConnection,
    queue: str,
    args: argparse.Namespace,
    settings: Settings,
) -> int:
    def report(done: Replayed) -> None:
        why = f" {printable(done.why)}" if done.why else ""
        print(
            f"{done.outcome:<13} message_id={printable(done.letter.message_id)}"
            f" reason={printable(done.letter.reason)}{why}",
            flush=True,
        )

    conn = await _claims_reader(settings) if args.dry_run else None
    try:
        summary = await replay(
            connection,
            queue,
            _selection(args),
            retention=settings.retention.keep,
            force=args.force,
            dry_run=args.dry_run,
            most=args.scan,
            report=report,
            claims=None if conn is None else database_claims(conn, settings.database.schema),
        )
    finally:
        if conn is not None:
            await conn.close()
    counts = " ".join(f"{outcome}={summary.counts[outcome]}" for outcome in Outcome)
    unread = summary.held - summary.read
    print(
        f"dlq: queue={printable(summary.dlq)} target={printable(summary.target)}"
        f" held={summary.held} read={summary.read} {counts}"
        + (f" unread={unread} (past --scan)" if unread > 0 else "")
    )
    return 0


async def _claims_reader(settings: Settings) -> asyncpg.Connection[asyncpg.Record] | None:
    """A connection to read claims through, for a dry run; None (said why) if there is none."""
    try:
        conn = await asyncpg.connect(settings.database.url)
    except (OSError, asyncpg.PostgresError) as exc:
        print(
            f"dlq: claims not read ({printable(repr(exc))}): no would_be_duplicate told apart",
            file=sys.stderr,
        )
        return None
    try:
        await check_schema(conn, settings.database.schema)
    except SchemaMissing as exc:
        await conn.close()
        print(
            f"dlq: claims not read ({printable(str(exc))}): no would_be_duplicate told apart",
            file=sys.stderr,
        )
        return None
    return conn


async def _archive(
    connection: aio_pika.abc.AbstractConnection, queue: str, args: argparse.Namespace
) -> int:
    if not args.yes:
        print("idempotent-workers: dlq archive deletes the messages it takes: add --yes")
        return 2

    async def keep(letter: DeadLetter) -> None:
        print(
            f"archived      message_id={printable(letter.message_id)}"
            f" reason={printable(letter.reason)} body={printable(letter.message.body)}",
            flush=True,
        )

    summary = await archive(connection, queue, _selection(args), most=args.scan, keep=keep)
    print(
        f"dlq: queue={printable(summary.dlq)} held={summary.held} read={summary.read}"
        f" archived={summary.archived}"
    )
    return 0
