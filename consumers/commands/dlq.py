"""`idempotent-workers dlq list|show|replay|archive QUEUE`: the commands and what they print.

QUEUE is the work queue (`orders`) or its dead-letter queue (`orders.dlq`).
Everything printed that came from a message goes through `printable()`: no
escape sequence, NUL or bidi override reaches the terminal raw. `show` takes
a message_id as typed or as `list` prints it, and prints each copy as
`consumers.commands.display` writes it (JSON bodies pretty-printed, times in
ISO 8601). `archive` writes each message it takes out as one JSON line on
standard output (`consumers.commands.archive.archived_record`) before its ack,
and its summary on standard error: what it printed is where they are kept.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from typing import Any

import aio_pika
import asyncpg

from consumers.broker.connection import connect_once
from consumers.commands.archive import archive, archived_record
from consumers.commands.deadletters import DeadLetter, NoSuchQueue, read_dead_letters, work_queue_of
from consumers.commands.display import shown
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


ARCHIVE_SAID = (
    "take the chosen dead letters out of the DLQ; each is printed whole (properties,"
    " headers, body) as one JSON line on standard output before it leaves the DLQ:"
    " redirect it to a file to keep them"
)


def register(sub: Any) -> None:
    """Add `dlq` to the CLI's subcommands."""
    said = "list, show, replay or archive dead letters"
    dlq = sub.add_parser("dlq", help=said, description=f"{said} (dlq ACTION --help: its flags)")
    actions = dlq.add_subparsers(dest="action", required=True, help="ACTION --help: its flags")

    def action(name: str, said: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=said, description=said)
        return parser

    listing = action("list", "one line per dead letter, without removing any")
    show = action(
        "show", "every copy of one message, whole: properties, headers, body (times in ISO 8601)"
    )
    again = action("replay", "send chosen dead letters back to the work queue the DLQ belongs to")
    gone = action("archive", ARCHIVE_SAID)
    for parser in (listing, show, again, gone):
        parser.add_argument("queue", help="the work queue, or its dead-letter queue")
        parser.add_argument(
            "--scan", type=int, default=10_000, help="read at most this many dead letters"
        )
    show.add_argument("message_id", help="as published, or as dlq list prints it")
    for parser in (listing, again, gone):
        parser.add_argument("--reason", help="a pattern: max_attempts_exceeded:*")
        parser.add_argument("--message-id", help="this message_id only")
        parser.add_argument("--tenant", help="the x-tenant header ('' for none)")
        parser.add_argument("--since", type=since, help="first dead-lettered since: 2h, 7d, ISO")
        parser.add_argument("--limit", type=int, default=100, help="at most this many (100)")
    again.add_argument(
        "--dry-run",
        action="store_true",
        help="say what a replay would do with each: run, duplicate, dead-lettered again (why)",
    )
    again.add_argument(
        "--force", action="store_true", help="replay even what is older than retention"
    )
    gone.add_argument(
        "--yes",
        action="store_true",
        help="required: the messages leave the DLQ (kept in the output)",
    )


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
        print(f"copy {number} of {len(copies)}")
        for line in shown(letter):
            print(line)
    return 0


async def _replay(
    connection: aio_pika.abc.AbstractConnection,
    queue: str,
    args: argparse.Namespace,
    settings: Settings,
) -> int:
    def report(done: Replayed) -> None:
        again = f" again={printable(done.again)}" if done.again else ""
        why = f" {printable(done.why)}" if done.why else ""
        print(
            f"{done.outcome:<13} message_id={printable(done.letter.message_id)}"
            f" reason={printable(done.letter.reason)}{again}{why}",
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
            max_body_bytes=settings.worker.max_body_bytes,
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
        print(
            "idempotent-workers: dlq archive takes the messages out of the DLQ, kept only in"
            " what it prints: add --yes",
            file=sys.stderr,
        )
        return 2

    async def keep(letter: DeadLetter) -> None:
        print(archived_record(letter), flush=True)  # kept before archive() acks it

    summary = await archive(connection, queue, _selection(args), most=args.scan, keep=keep)
    print(
        f"dlq: queue={printable(summary.dlq)} held={summary.held} read={summary.read}"
        f" archived={summary.archived} (one JSON line each on standard output)",
        file=sys.stderr,
    )
    return 0
