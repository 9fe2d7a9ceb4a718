"""A week of claims as production leaves them, put in by COPY: the steady bench's prefill.

`fill(...)` makes the generations the cleaner would have made (`dedupe.generations`:
`make_ahead` and `rotate`, the real DDL) and fills them:

1. generations: ENDED of them ended one span apart, the newest a span ago, and
   the current one began half a span ago (the mean fill of a current
   generation); `dedupe_generations` says so, so a cleanup run would drop and
   rotate as it would in production;
2. rows: the stated rate (rows over the spans they cover), in time order
   within each generation, random-looking message ids (md5 of a counter, as
   UUIDs) so that new keys land all over each primary key, as real ones do;
3. COPY: PostgreSQL makes the rows (`COPY (SELECT ... generate_series) TO
   STDOUT`, binary) and takes them back into the generation's table on a
   second connection (`COPY ... FROM STDIN`), streamed through this process
   untouched; nothing is made per row in Python;
4. each generation's primary key is dropped while it is filled and built
   after (a sorted build, far cheaper than millions of random inserts) with
   fillfactor 70, about how full random inserts leave a B-tree's leaves, so
   the index is the size a claimed one is; then VACUUM ANALYZE, and a
   CHECKPOINT at the end.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import asyncpg

from dedupe import generations, quote_ident
from dedupe.generations import PROCESSED_MESSAGES
from proving.bench.workload import TENANT
from proving.deadlines import ANSWER_S, within

BYTES_PER_ROW = 260  # heap and primary key at fillfactor 70, measured; the WAL comes and goes
FILL_TIMEOUT_S = 6 * 3600.0
LEAF_FILL = 70


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    rows: int  # in all
    ended: int  # generations ended within the retention, beside the current one
    span: datetime.timedelta  # each generation's

    @property
    def spans(self) -> float:
        return self.ended + 0.5  # the current generation is half full

    @property
    def per_span(self) -> int:
        return int(self.rows / self.spans)

    @property
    def rate(self) -> float:
        """Messages a second that leave these rows behind."""
        return self.rows / (self.spans * self.span.total_seconds())

    def counts(self) -> list[int]:
        """Rows of each generation, oldest first, the current one last."""
        ended = [self.per_span] * self.ended
        return [*ended, self.rows - sum(ended)]


def plan(rows: int, days: float, span: datetime.timedelta) -> Plan:
    """The generations a retention of `days` keeps when each spans `span`."""
    ended = max(1, round(datetime.timedelta(days=days) / span))
    return Plan(rows=rows, ended=ended, span=span)


async def _piped(
    source: asyncpg.Connection, query: str, args: tuple[object, ...]
) -> AsyncIterator[bytes]:
    """The binary COPY output of `query`, chunk by chunk."""
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)

    async def put(chunk: bytes) -> None:
        await chunks.put(chunk)

    async def produce() -> None:
        try:
            await source.copy_from_query(query, *args, output=put, format="binary")
        finally:
            await chunks.put(None)

    producer = asyncio.create_task(produce())
    try:
        # A fill of tens of millions of rows takes as long as the disk does (its progress said).
        # unbounded: the producer puts None at the COPY's end or at its error
        while (chunk := await chunks.get()) is not None:
            yield chunk
        # unbounded: the producer ended (it put its None); this only hands on its error
        await producer
    finally:
        producer.cancel()


async def fill(
    url: str,
    *,
    schema: str,
    consumer: str,
    layout: Plan,
    progress: Callable[[str], None],
) -> float:
    """Make and fill the generations of `layout`; return the seconds it took."""
    started = time.perf_counter()
    q = quote_ident(schema)
    source = await asyncpg.connect(url, timeout=ANSWER_S)
    sink = await asyncpg.connect(url, timeout=ANSWER_S)
    try:
        await sink.execute("SET maintenance_work_mem = '512MB'", timeout=ANSWER_S)
        first = (await generations.current(sink, schema, PROCESSED_MESSAGES)).number
        for _ in range(layout.ended):
            await generations.rotate(sink, schema, PROCESSED_MESSAGES)
        await generations.make_ahead(sink, schema, PROCESSED_MESSAGES)
        span_s = layout.span.total_seconds()
        made = 0
        for k, count in enumerate(layout.counts()):
            number = first + k
            part = quote_ident(PROCESSED_MESSAGES.partition(number))
            pkey = quote_ident(PROCESSED_MESSAGES.partition(number) + "_pkey")
            # Generation k began (ended - k + 0.5) spans ago; the current one, half a span ago.
            began_ago = (layout.ended - k + 0.5) * span_s
            ended_ago = (layout.ended - k - 0.5) * span_s if k < layout.ended else None
            await sink.execute(f"ALTER TABLE {q}.{part} DROP CONSTRAINT {pkey}", timeout=ANSWER_S)
            query = (
                "SELECT $1::text, $2::text, md5('prefill' || i)::uuid::text,"
                " sha256(int8send(i)), now() - make_interval(secs => $3::float8)"
                "  + make_interval(secs => (i - $4::bigint) * $5::float8), $6::int"
                " FROM generate_series($4::bigint, $7::bigint) AS i"
            )
            step = (span_s if ended_ago is not None else span_s / 2) / max(count, 1)
            args = (consumer, TENANT, began_ago, made, step, number, made + count - 1)
            await within(
                FILL_TIMEOUT_S,
                f"the COPY of generation {number}",
                sink.copy_to_table(
                    PROCESSED_MESSAGES.partition(number),
                    schema_name=schema,
                    source=_piped(source, query, args),
                    columns=[
                        "consumer",
                        "tenant",
                        "message_id",
                        "fingerprint",
                        "processed_at",
                        "generation",
                    ],
                    format="binary",
                ),
            )
            made += count
            progress(
                f"prefill: generation {number}: {count:,} rows copied, building its primary key"
                f" ({made:,} of {layout.rows:,}, {time.perf_counter() - started:.0f} s)"
            )
            await sink.execute(
                f"ALTER TABLE {q}.{part} ADD CONSTRAINT {pkey}"
                f" PRIMARY KEY ({', '.join(PROCESSED_MESSAGES.key)})"
                f" WITH (fillfactor = {LEAF_FILL})",
                timeout=FILL_TIMEOUT_S,
            )
            await sink.execute(f"VACUUM ANALYZE {q}.{part}", timeout=FILL_TIMEOUT_S)
            await sink.execute(
                f"UPDATE {q}.dedupe_generations SET"
                " began_at = now() - make_interval(secs => $2::float8),"
                " ended_at = now() - make_interval(secs => $3::float8)"
                " WHERE family = 'processed_messages' AND generation = $1",
                number,
                began_ago,
                ended_ago,
                timeout=ANSWER_S,
            )
        progress("prefill: checkpoint")
        await sink.execute("CHECKPOINT", timeout=FILL_TIMEOUT_S)
    finally:
        await source.close()
        await sink.close()
    return time.perf_counter() - started
