"""What the pages show, read from the broker and the database; nothing here writes.

A DLQ is read as `dlq list` reads it (`consumers.commands.deadletters`): a consumer
that never acks, its channel closed at once, every message back in place.
One message's story is `inspect`'s (`dedupe.look_up`).
"""

from __future__ import annotations

import datetime
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aio_pika
from markupsafe import Markup

from console.audit import Done
from console.chart import Chart, arrivals
from console.escape import shown_body
from consumers.commands.deadletters import DeadLetter, read_dead_letters
from consumers.commands.printable import printable
from consumers.commands.replay import same_body
from consumers.handlers.retry import dead_letter_queue
from consumers.jobs.kind import shown_address
from consumers.message.envelope import is_text
from dedupe import KeyRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasonRow:
    reason: str
    count: int
    oldest: datetime.datetime | None
    newest: datetime.datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueView:
    queue: str
    dlq: str
    held: int  # in the DLQ when read
    read: int
    reasons: tuple[ReasonRow, ...]
    oldest: datetime.datetime | None
    newest: datetime.datetime | None
    chart: Chart | None


async def read_queue(
    connection: aio_pika.abc.AbstractConnection, queue: str, most: int
) -> tuple[list[DeadLetter], int]:
    """Up to `most` dead letters of `queue`'s DLQ and how many it holds; all given back."""
    channel = await connection.channel()
    try:
        return await read_dead_letters(channel, dead_letter_queue(queue), most=most)
    finally:
        await channel.close()  # every message read goes back, unacked


def summarize(
    queue: str, letters: Sequence[DeadLetter], held: int, now: datetime.datetime
) -> QueueView:
    """Counts, oldest and newest by reason, and the arrivals chart."""
    by_reason: dict[str, list[DeadLetter]] = {}
    for letter in letters:
        by_reason.setdefault(letter.reason, []).append(letter)
    rows = [
        ReasonRow(reason=reason, count=len(group), oldest=_first(group), newest=_last(group))
        for reason, group in by_reason.items()
    ]
    rows.sort(key=lambda row: (-row.count, row.reason))
    return QueueView(
        queue=queue,
        dlq=dead_letter_queue(queue),
        held=held,
        read=len(letters),
        reasons=tuple(rows),
        oldest=_first(letters),
        newest=_last(letters),
        chart=arrivals([letter.dead_lettered_at for letter in letters], now),
    )


def _first(letters: Sequence[DeadLetter]) -> datetime.datetime | None:
    return min((x.dead_lettered_at for x in letters if x.dead_lettered_at), default=None)


def _last(letters: Sequence[DeadLetter]) -> datetime.datetime | None:
    return max((x.dead_lettered_at for x in letters if x.dead_lettered_at), default=None)


def addressable(letter: DeadLetter) -> bool:
    """Whether a URL can name `letter` by its key: a message_id, it and the tenant UTF-8."""
    return letter.message_id is not None and is_text(letter.message_id) and is_text(letter.tenant)


def letter_url(queue: str, letter: DeadLetter) -> str:
    """The page of `letter`: by its key when a URL can hold it, else by its digest."""
    if addressable(letter):
        query = {"queue": queue, "message_id": letter.message_id, "tenant": letter.tenant}
    else:
        query = {"queue": queue, "digest": letter.digest}
    return "/message?" + urllib.parse.urlencode(query)


def audited_url(queue: str, done: Done) -> str | None:
    """The page of a message an action took, by its id and tenant as the audit keeps them
    (printed: the message page reads that form too); None without a message_id."""
    if done.message_id == printable(None):
        return None
    query = {"queue": queue, "message_id": done.message_id, "tenant": done.tenant}
    return "/message?" + urllib.parse.urlencode(query)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimVerdict:
    """What the claim row says a replay of this copy would do."""

    claimed: bool
    noop: bool  # claimed with this body's default fingerprint
    text: str


NO_KEY = ClaimVerdict(
    claimed=False,
    noop=False,
    text="no dedupe key (no message_id, or an id or tenant that is not UTF-8):"
    " a replay would skip it",
)


def claim_verdict(record: KeyRecord | None, body: bytes) -> ClaimVerdict:
    if record is None:
        return NO_KEY
    claim = record.claim
    if claim is None:
        return ClaimVerdict(
            claimed=False,
            noop=False,
            text="not processed (never committed, or its claim deleted by retention):"
            " a replay would run it",
        )
    when = claim.processed_at.isoformat(timespec="seconds")
    if same_body(claim, body):
        return ClaimVerdict(
            claimed=True,
            noop=True,
            text=f"already processed at {when}: a replay would be a no-op",
        )
    return ClaimVerdict(
        claimed=True,
        noop=False,
        text=f"claimed at {when} for another body: a replay would be dead-lettered again"
        " as message_id_reused (unless the consumer's own fingerprint ignores the difference)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ShownCopy:
    """One copy of a message in the DLQ, as its page shows it."""

    letter: DeadLetter
    headers: tuple[tuple[str, object], ...]  # dotted name, value
    body: Markup
    is_json: bool
    verdict: ClaimVerdict


def shown_copy(letter: DeadLetter, record: KeyRecord | None) -> ShownCopy:
    body, is_json = shown_body(letter.message.body)
    return ShownCopy(
        letter=letter,
        headers=tuple(header_rows(letter.message.headers or {})),
        body=body,
        is_json=is_json,
        verdict=claim_verdict(record, letter.message.body),
    )


def shown_sends(record: KeyRecord) -> list[dict[str, object]]:
    """The ledger's rows with each device token (and e-mail address) cut short."""
    return [
        {**row, "address": shown_address(str(row.get("channel")), str(row.get("address") or ""))}
        for row in record.sends
    ]


def header_rows(headers: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, object]]:
    """Every header as (dotted name, value), nested tables and lists flattened, sorted."""
    for name in sorted(headers):
        value = headers[name]
        path = f"{prefix}{name}"
        if isinstance(value, Mapping):
            yield from header_rows(value, f"{path}.")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, Mapping):
                    yield from header_rows(item, f"{path}[{index}].")
                else:
                    yield f"{path}[{index}]", item
        else:
            yield path, value
