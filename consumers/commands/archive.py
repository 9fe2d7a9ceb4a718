"""`dlq archive` and the console's archive button: take chosen dead letters out of a DLQ.

For each dead letter read (in queue order), in this order:

1. not selected (the same `Selection` as `dlq replay`), or past its limit   left alone
2. handed to `keep` (the console writes it, body and all, to its audit     kept
   table and commits; the CLI prints it)
3. acked: gone from the DLQ                                               archived

`keep` returns before the ack, so a message is never gone without having
been kept: a crash between the two leaves it in the DLQ and kept twice at
most, never lost. What is not chosen goes back in place when the reading
channel closes, as `dlq list` leaves it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aio_pika

from consumers.commands.deadletters import DeadLetter, read_dead_letters
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
