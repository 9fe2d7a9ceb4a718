"""`dlq archive` and the console's archive button: move chosen dead letters out of a DLQ,
each kept whole first.

To archive is to take a dead letter out of its DLQ (so `list` and `replay` no
longer see it) after keeping a copy elsewhere. For each dead letter read (in
queue order), in this order:

1. not selected (the same `Selection` as `dlq replay`), or past its limit   left alone
2. handed to `keep`, which keeps it whole:                                 kept
   - the console: its headers and body, in the audit table
     `console_action_messages`, committed;
   - the CLI: `archived_record()`, one JSON line on standard output
     (properties, headers, body), written and flushed
3. acked: gone from the DLQ                                               archived

`keep` returns before the ack, so a message is never gone without having
been kept: a crash between the two leaves it in the DLQ and kept twice at
most, never lost. What is not chosen goes back in place when the reading
channel closes, as `dlq list` leaves it.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aio_pika

from consumers.commands.deadletters import DeadLetter, read_dead_letters
from consumers.commands.display import PROPERTIES, iso_utc
from consumers.commands.replay import Selection
from consumers.handlers.retry import dead_letter_queue


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveSummary:
    dlq: str
    held: int  # messages in the DLQ when read
    read: int
    archived: int


async def archive(
    connection: aio_pika.abc.AbstractConnection,
    queue: str,
    selection: Selection,
    *,
    most: int,
    keep: Callable[[DeadLetter], Awaitable[None]],
) -> ArchiveSummary:
    """Remove what `selection` picks from `queue`'s DLQ, each one kept by `keep` first."""
    dlq = dead_letter_queue(queue)
    reading = await connection.channel()
    archived = 0
    try:
        letters, held = await read_dead_letters(reading, dlq, most=most)  # 1.
        for letter in [x for x in letters if selection.matches(x)][: selection.limit]:
            await keep(letter)  # 2. kept (committed, when keep writes a table)
            await letter.message.ack()  # 3. only then gone from the DLQ
            archived += 1
    finally:
        await reading.close()  # what was not acked goes back to the DLQ, in place
    return ArchiveSummary(dlq=dlq, held=held, read=len(letters), archived=archived)


def archived_record(letter: DeadLetter) -> str:
    """`letter` whole as one line of JSON: what the CLI keeps of an archived message.

    {"message_id", "tenant", "reason", "properties", "headers", "body"}: a body
    that is not UTF-8 is "body_base64" instead, a header's bytes
    {"base64": ...}, times ISO 8601 UTC. Every character past ASCII or below
    space is a JSON escape, so the line is safe on a terminal and reads back
    to the same values.
    """
    message = letter.message
    record: dict[str, Any] = {
        "message_id": letter.message_id,
        "tenant": letter.tenant,
        "reason": letter.reason,
        "properties": {
            name: _plain(getattr(message, name))
            for name in PROPERTIES
            if getattr(message, name, None) is not None
        },
        "headers": _plain(message.headers or {}),
    }
    try:
        record["body"] = message.body.decode()
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(message.body).decode()
    return json.dumps(record, ensure_ascii=True)


def _plain(value: Any) -> Any:
    """`value` (a header or property as aio-pika reads it) as JSON can hold it."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime.datetime):
        return iso_utc(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)  # an enum (delivery_mode), say
