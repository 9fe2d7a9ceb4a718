"""Arrivals over time as bars, for an inline SVG drawn by the template.

The span from the oldest dead letter to now is cut into `BARS` equal slots;
each bar's height is its count against the fullest slot's. No JavaScript, no
library: the template writes one `<rect>` per bar.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

BARS = 24
HEIGHT = 60  # of the drawing area, in SVG units


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    start: datetime.datetime
    count: int
    height: int  # 0..HEIGHT


@dataclass(frozen=True, slots=True, kw_only=True)
class Chart:
    bars: tuple[Bar, ...]
    start: datetime.datetime
    end: datetime.datetime
    slot: datetime.timedelta
    undated: int  # dead letters that carry no date

    @property
    def most(self) -> int:
        return max((bar.count for bar in self.bars), default=0)


def arrivals(
    moments: Sequence[datetime.datetime | None], now: datetime.datetime, bars: int = BARS
) -> Chart | None:
    """The chart of `moments` (when each dead letter arrived); None when none is dated."""
    dated = [moment for moment in moments if moment is not None]
    if not dated:
        return None
    start = min(dated)
    span = max(now - start, datetime.timedelta(minutes=1))
    slot = span / bars
    counts = [0] * bars
    for moment in dated:
        counts[min(int((moment - start) / slot), bars - 1)] += 1
    top = max(counts)
    return Chart(
        bars=tuple(
            Bar(start=start + slot * n, count=count, height=round(HEIGHT * count / top))
            for n, count in enumerate(counts)
        ),
        start=start,
        end=now,
        slot=slot,
        undated=len(moments) - len(dated),
    )
