"""Arrivals over time as bars, for an inline SVG drawn by the template.

1. The bucket is the smallest round step (`STEPS`: 1 s, 5 s, 10 s, 30 s, 1 min,
   ... 1 d, 7 d, 30 d, 365 d) that draws the span from the oldest dead letter
   to now in at most `MOST_BARS` bars (`step_for`).
2. Bars start on multiples of the step (UTC): a 10 s bar starts at :00, :10, ...
3. The time axis is labelled at most `MOST_TICKS` times, on the smallest round
   multiple of the step (`TICKS`) whose labels do not overlap, as `HH:MM:SS`,
   `HH:MM`, `Dec 07` or `2026-12-07`, whichever that multiple needs.
4. The count scale goes to the next 1, 2 or 5 times a power of ten at or above
   the fullest bar, labelled at 0, its half (when whole) and its top.

No JavaScript, no library: the template writes one `<rect>` per bar and one
`<text>` per tick, at the positions computed here.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass

_S = datetime.timedelta(seconds=1)
_MIN = datetime.timedelta(minutes=1)
_H = datetime.timedelta(hours=1)
_D = datetime.timedelta(days=1)
STEPS = (
    *(n * _S for n in (1, 5, 10, 30)),
    *(n * _MIN for n in (1, 5, 10, 30)),
    *(n * _H for n in (1, 3, 6, 12)),
    *(n * _D for n in (1, 7, 30, 365)),
)
# Where the time axis may be labelled: a multiple of the bars' step among these.
TICKS = (
    *(n * _S for n in (1, 5, 10, 15, 30)),
    *(n * _MIN for n in (1, 2, 5, 10, 15, 30)),
    *(n * _H for n in (1, 2, 3, 6, 12)),
    *(n * _D for n in (1, 2, 7, 14, 28, 30, 91, 365)),
)
MOST_BARS = 30
MOST_TICKS = 6
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

# The drawing, in SVG units: the count scale left of the bars, the times under them.
LEFT = 30
BAR = 14  # a bar's width and the gap after it
TOP = 6
HEIGHT = 60
BOTTOM = 16
RIGHT = 30  # room for the last time label
_CHAR = 5.5  # the width of a label's character (9px digits), and a label's margin
_MARGIN = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    start: datetime.datetime
    count: int
    x: int
    height: int  # 0..HEIGHT


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    at: float  # x on the time axis, y on the count scale
    label: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Chart:
    bars: tuple[Bar, ...]
    start: datetime.datetime
    end: datetime.datetime
    step: datetime.timedelta
    top: int  # the count at the top of the scale
    times: tuple[Tick, ...]
    counts: tuple[Tick, ...]
    undated: int  # dead letters that carry no date

    @property
    def most(self) -> int:
        return max((bar.count for bar in self.bars), default=0)

    @property
    def left(self) -> int:
        """The x of the count scale."""
        return LEFT

    @property
    def right(self) -> int:
        """The x where the last bar ends."""
        return LEFT + len(self.bars) * BAR

    @property
    def width(self) -> int:
        return self.right + RIGHT

    @property
    def height(self) -> int:
        return TOP + HEIGHT + BOTTOM

    @property
    def base(self) -> int:
        """The y of the time axis."""
        return TOP + HEIGHT


def step_for(span: datetime.timedelta) -> datetime.timedelta:
    """1. The smallest of `STEPS` that draws `span` in at most `MOST_BARS` bars (one more
    for the first bar's start, rounded down to a multiple of the step)."""
    for step in STEPS:
        if span / step + 1 <= MOST_BARS:
            return step
    return STEPS[-1] * math.ceil((span / STEPS[-1] + 1) / MOST_BARS)


def arrivals(moments: Sequence[datetime.datetime | None], now: datetime.datetime) -> Chart | None:
    """The chart of `moments` (when each dead letter arrived); None when none is dated."""
    dated = [moment for moment in moments if moment is not None]
    if not dated:
        return None
    oldest = min(dated)
    step = step_for(max(now - oldest, datetime.timedelta(0)))
    start = _EPOCH + (oldest - _EPOCH) // step * step  # 2.
    n = max(1, math.ceil((now - start) / step))
    counts = [0] * n
    for moment in dated:
        counts[min(int((moment - start) / step), n - 1)] += 1  # a clock ahead: the last bar
    top = _round_up(max(counts))
    return Chart(
        bars=tuple(
            Bar(
                start=start + step * i,
                count=count,
                x=LEFT + i * BAR,
                height=round(HEIGHT * count / top),
            )
            for i, count in enumerate(counts)
        ),
        start=start,
        end=now,
        step=step,
        top=top,
        times=_times(start, n, step),
        counts=tuple(
            Tick(at=TOP + HEIGHT - HEIGHT * value / top, label=str(value)) for value in _scale(top)
        ),
        undated=len(moments) - len(dated),
    )


def _times(start: datetime.datetime, n: int, step: datetime.timedelta) -> tuple[Tick, ...]:
    """3. The labelled times: every `every`, from the first multiple of it in the chart."""
    end = start + n * step

    def fits(every: datetime.timedelta) -> bool:
        apart = every / step * BAR
        wide = len(datetime.datetime(2026, 12, 7).strftime(_shown(every))) * _CHAR + _MARGIN
        return _count(start, end, every) <= MOST_TICKS and apart >= wide

    multiples = [t for t in TICKS if t >= step and t % step == datetime.timedelta(0)]
    fallback = step * max(math.ceil(n / (MOST_TICKS - 1)), 5)  # 5 bars: room for a date
    every = next((t for t in multiples if fits(t)), fallback)
    first = _EPOCH + -((_EPOCH - start) // every) * every  # rounded up to a multiple
    ticks = []
    moment = first
    while moment <= end:
        x = LEFT + (moment - start) / step * BAR
        ticks.append(Tick(at=x, label=moment.strftime(_shown(every))))
        moment += every
    if not ticks:  # a chart too short for a round time: its start
        ticks.append(Tick(at=LEFT, label=start.strftime(_shown(step))))
    return tuple(ticks)


def _shown(every: datetime.timedelta) -> str:
    """How a time on the axis is written: as much as ticks `every` apart need."""
    if every % _MIN:
        return "%H:%M:%S"
    if every % _D:
        return "%H:%M"
    return "%b %d" if every < 365 * _D else "%Y-%m-%d"


def _count(start: datetime.datetime, end: datetime.datetime, every: datetime.timedelta) -> int:
    """How many multiples of `every` lie in [start, end]."""
    return (end - _EPOCH) // every - -((_EPOCH - start) // every) + 1


def _round_up(most: int) -> int:
    """4. The next 1, 2 or 5 times a power of ten at or above `most` (at least 1)."""
    power = 1
    while True:
        for top in (power, 2 * power, 5 * power):
            if top >= most:
                return top
        power *= 10


def _scale(top: int) -> tuple[int, ...]:
    return (0, top // 2, top) if top % 2 == 0 else (0, top)
