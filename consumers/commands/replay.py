"""`dlq replay`: send chosen dead letters back to the queue their DLQ belongs to.

For each dead letter read (in queue order), in this order:

1. not selected (`--reason`, `--message-id`, `--tenant`,     left alone
   `--since`)
2. past `--limit` selected ones                                left alone
3. no message_id, or a property or header that is not UTF-8  skipped: reported, left in the DLQ
4. first dead-lettered longer ago than retention               refused unless `--force`: its
                                                               claim may be deleted, so a replay
                                                               could apply it a second time
5. `--dry-run`: what the worker would do with the copy          would_dead_letter_again (with
   (`consumers.commands.dry_run`, the worker's own decode and   `again`, the reason: invalid_json,
   job parser): dead-letter it again                            message_id_reused...)
                     ack it as a duplicate (its key claimed     would_be_duplicate
                     with this body's fingerprint)
                     run it                                     would_replay
6. republished to the work queue, confirmed, then acked        replayed

`dlq replay` and the console's replay button both call `replay()`: one path,
two faces. Step 5 asks `Claims` (the database) once for every selected key;
without one, a dry run cannot tell a duplicate or a reused id from a run.

The target is always the work queue named by the command (`orders` for
`orders.dlq`), never the message's `x-original-queue` header, which anyone
who can publish could have set. The message_id is kept, so replaying a job
whose effect did commit (and whose claim is still there) is acked as a
duplicate, never run twice. One message that cannot be replayed is reported
and skipped; it never stops the ones after it.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import aio_pika

from consumers.commands.copies import replayed_copy
from consumers.commands.deadletters import (
    DeadLetter,
    NoSuchQueue,
    read_dead_letters,
    undecodable_header,
)
from consumers.commands.dry_run import Fate, Foretold, decoded, judged
from consumers.handlers.retry import dead_letter_queue
from consumers.message.envelope import Envelope, is_text
from consumers.settings import MAX_BODY_BYTES
from consumers.telemetry.tracing import Span, SpanKind, tracing
from dedupe import ClaimRow, DbConnection, claims, fingerprint


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """Which dead letters a command acts on; every given filter must match."""

    reason: str | None = None  # a shell pattern: `max_attempts_exceeded:*`
    message_id: str | None = None
    tenant: str | None = None  # "" selects the messages without a tenant
    since: datetime.datetime | None = None  # first dead-lettered at or after
    digest: str | None = None  # `DeadLetter.digest`: one dead letter, with or without an id
    limit: int = 100

    def matches(self, letter: DeadLetter) -> bool:
        if self.reason is not None and not fnmatch.fnmatchcase(letter.reason, self.reason):
            return False
        if self.message_id is not None and letter.message_id != self.message_id:
            return False
        if self.tenant is not None and letter.tenant != self.tenant:
            return False
        if self.digest is not None and letter.digest != self.digest:
            return False
        if self.since is not None:
            return letter.dead_lettered_at is not None and letter.dead_lettered_at >= self.since
        return True


class Outcome(StrEnum):
    REPLAYED = "replayed"
    WOULD_REPLAY = "would_replay"
    WOULD_BE_DUPLICATE = "would_be_duplicate"
    WOULD_DEAD_LETTER_AGAIN = "would_dead_letter_again"
    SKIPPED = "skipped"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True, kw_only=True)
class Replayed:
    letter: DeadLetter
    outcome: Outcome
    why: str = ""
    again: str = ""  # would_dead_letter_again: the reason it would be dead-lettered with


class Claims(Protocol):
    """Which of one consumer's keys (tenant, message_id) are claimed: `dedupe.claims`."""

    async def __call__(
        self, consumer: str, keys: Sequence[tuple[str, str]]
    ) -> Mapping[tuple[str, str], ClaimRow]: ...


def database_claims(conn: DbConnection, schema: str) -> Claims:
    """`Claims` read from the dedupe tables in `schema`, through `conn`."""

    async def claimed(
        consumer: str, keys: Sequence[tuple[str, str]]
    ) -> Mapping[tuple[str, str], ClaimRow]:
        return await claims(conn, schema, consumer, keys)

    return claimed


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySummary:
    dlq: str
    target: str
    held: int  # messages in the DLQ when read
    read: int
    counts: dict[Outcome, int]


async def replay(
    connection: aio_pika.abc.AbstractConnection,
    queue: str,
    selection: Selection,
    *,
    retention: datetime.timedelta,
    force: bool,
    dry_run: bool,
    most: int,
    report: Callable[[Replayed], None],
    claims: Claims | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> ReplaySummary:
    """Replay what `selection` picks from `queue`'s DLQ into `queue`; report each outcome.

    `max_body_bytes`: the workers' IW_MAX_BODY_BYTES, for a dry run's decode."""
    dlq = dead_letter_queue(queue)
    publishing = await connection.channel(publisher_confirms=True)
    try:
        await publishing.declare_queue(queue, passive=True)
    except aio_pika.exceptions.ChannelNotFoundEntity as exc:
        raise NoSuchQueue(queue) from exc
    reading = await connection.channel()
    counts = dict.fromkeys(Outcome, 0)
    try:
        letters, held = await read_dead_letters(reading, dlq, most=most)
        now = datetime.datetime.now(datetime.UTC)
        chosen = [letter for letter in letters if selection.matches(letter)][: selection.limit]
        foreseen = [
            decoded(
                replayed_copy(letter.message),
                consumer=queue,
                dead_lettered_as=letter.reason,
                max_body_bytes=max_body_bytes,
            )
            for letter in (chosen if dry_run else [])
        ]
        keys = sorted({(e.tenant, e.message_id) for e in foreseen if isinstance(e, Envelope)})
        claimed = await claims(queue, keys) if claims is not None and keys else {}
        for n, letter in enumerate(chosen):
            done = await _replay_one(
                publishing,
                queue,
                letter,
                now=now,
                retention=retention,
                force=force,
                dry_run=dry_run,
            )
            if done.outcome is Outcome.WOULD_REPLAY:
                done = _foretold(done, foreseen[n], claimed)
            counts[done.outcome] += 1
            report(done)
    finally:
        await reading.close()  # what was not acked goes back to the DLQ, in place
        await publishing.close()
    return ReplaySummary(dlq=dlq, target=queue, held=held, read=len(letters), counts=counts)


async def _replay_one(
    channel: aio_pika.abc.AbstractChannel,
    queue: str,
    letter: DeadLetter,
    *,
    now: datetime.datetime,
    retention: datetime.timedelta,
    force: bool,
    dry_run: bool,
) -> Replayed:
    message = letter.message
    if letter.message_id is None:
        return Replayed(
            letter=letter, outcome=Outcome.SKIPPED, why="no message_id: it has no dedupe key"
        )
    bad_property = next(
        (
            name
            for name in ("message_id", "content_type", "content_encoding", "correlation_id", "type")
            if not is_text(getattr(message, name) or "")
        ),
        None,
    )
    if bad_property is not None:
        return Replayed(
            letter=letter, outcome=Outcome.SKIPPED, why=f"property {bad_property} is not UTF-8"
        )
    bad = undecodable_header(message.headers or {})
    if bad is not None:
        return Replayed(letter=letter, outcome=Outcome.SKIPPED, why=f"header {bad} is not UTF-8")
    age = letter.age(now)
    if not force and (age is None or age > retention):
        day = datetime.timedelta(days=1)
        told = "an unknown time ago" if age is None else f"{age / day:.1f} days ago"
        return Replayed(
            letter=letter,
            outcome=Outcome.REFUSED,
            why=(
                f"dead-lettered {told}, retention is {retention / day:g} days: its claim"
                " may be deleted and a replay could apply it twice (--force to replay)"
            ),
        )
    if dry_run:
        return Replayed(letter=letter, outcome=Outcome.WOULD_REPLAY)
    copy = replayed_copy(message)
    span = _replay_span(queue, letter, copy)
    try:
        await channel.default_exchange.publish(copy, routing_key=queue, mandatory=True)
    except aio_pika.exceptions.ChannelInvalidStateError:
        raise  # the channel is gone: nothing after this can be replayed either
    except Exception as exc:  # this message only: report it, go on with the next
        return Replayed(letter=letter, outcome=Outcome.SKIPPED, why=f"publish failed: {exc!r}")
    finally:
        if span is not None:
            span.end()
    await message.ack()  # only after the broker confirmed the replay
    return Replayed(letter=letter, outcome=Outcome.REPLAYED)


def _foretold(
    done: Replayed,
    seen: Envelope | Foretold,
    claimed: Mapping[tuple[str, str], ClaimRow],
) -> Replayed:
    """A dry run's would_replay, told apart by what the worker would do with the copy."""
    if isinstance(seen, Foretold):
        told = seen
    else:
        told = judged(seen, claimed.get((seen.tenant, seen.message_id)))
    if told.fate is Fate.DEAD_LETTER:
        return Replayed(
            letter=done.letter,
            outcome=Outcome.WOULD_DEAD_LETTER_AGAIN,
            why=told.why,
            again=told.reason,
        )
    if told.fate is Fate.DUPLICATE:
        return Replayed(letter=done.letter, outcome=Outcome.WOULD_BE_DUPLICATE, why=told.why)
    return done


def same_body(claim: ClaimRow, body: bytes) -> bool:
    """Whether `claim` was made for this JSON body, by the default fingerprint."""
    try:
        return claim.fingerprint == fingerprint(json.loads(body))
    except ValueError:
        return False


def _replay_span(queue: str, letter: DeadLetter, copy: aio_pika.Message) -> Span | None:
    """With tracing on: a "replay <queue>" PRODUCER span linked to the dead letter's own
    trace (its publisher's `traceparent`, kept as it came); the replayed copy carries
    the replay's context, so its processing joins the replay's trace."""
    traces = tracing()
    if not traces.on:
        return None
    original = letter.message.headers or {}
    span = traces.span(
        f"replay {queue}",
        SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.destination.name": queue,
            "messaging.operation.type": "send",
            "messaging.operation.name": "replay",
            "messaging.message.id": letter.message_id or "",
        },
        links=[original],
    )
    copy.headers = {**(copy.headers or {}), **traces.headers(span)}
    return span
