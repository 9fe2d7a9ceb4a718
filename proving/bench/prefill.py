"""Fill processed_messages with millions of claims, to see what a big inbox costs.

`bench --prefill ROWS`: the rows a week of retention leaves behind for the
benched consumer, in daily generations as the cleaner keeps them
(`proving.bench.steady_fill`: seven ended generations and the current one
half full, random-looking message ids, put in by COPY, each primary key
built after, then VACUUM ANALYZE and a CHECKPOINT).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from proving.bench.steady_fill import fill, plan

DAYS = 7.0
SPAN = timedelta(days=1)


async def prefill(
    url: str,
    *,
    schema: str,
    consumer: str,
    rows: int,
    progress: Callable[[str], None],
) -> float:
    """Put `rows` claims of `consumer` in `schema`; return the seconds it took."""
    layout = plan(rows, DAYS, SPAN)
    return await fill(url, schema=schema, consumer=consumer, layout=layout, progress=progress)
