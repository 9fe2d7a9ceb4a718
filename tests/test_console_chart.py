"""The arrivals chart: a round bucket (1 s, 5 s, 10 s, ... 1 d, 7 d), times on its axis, a
count scale; and the page that draws it."""

from __future__ import annotations

import datetime
import re
import time

import aio_pika
import httpx
import pytest

from console import chart
from consumers import Settings, dead_letter_queue
from consumers.broker.topology import declare
from consumers.pipeline.settle import DEAD_LETTERED_AT_HEADER
from dedupe import DbConnection
from tests.apps.effects import FAST_RETRY
from tests.console_support import console_in_process, make_tokens, publish

S = datetime.timedelta(seconds=1)
MIN = datetime.timedelta(minutes=1)
H = datetime.timedelta(hours=1)
D = datetime.timedelta(days=1)
NOW = datetime.datetime(2026, 12, 7, 11, 34, 27, 400_000, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("span", "step"),
    [
        (0 * S, S),
        (20 * S, S),
        (24 * 7.41 * S, 10 * S),  # the chart that read "Arrivals per 7.41 s"
        (2 * MIN, 5 * S),
        (10 * MIN, 30 * S),
        (H, 5 * MIN),
        (5 * H, 30 * MIN),
        (D, H),
        (8 * D, 12 * H),
        (90 * D, 7 * D),
        (3 * 365 * D, 365 * D),
    ],
)
def test_the_bucket_is_the_smallest_round_step_that_draws_the_span_in_few_bars(
    span: datetime.timedelta, step: datetime.timedelta
) -> None:
    assert chart.step_for(span) == step
    assert span / step + 1 <= chart.MOST_BARS


def test_bars_start_on_round_times_and_count_every_dated_letter_once() -> None:
    moments = [NOW - 170 * S, NOW - 61 * S, NOW - 60 * S, NOW, None]
    drawn = chart.arrivals(moments, NOW)
    assert drawn is not None
    assert drawn.step == 10 * S and drawn.start == datetime.datetime(
        2026, 12, 7, 11, 31, 30, tzinfo=datetime.UTC
    )
    assert sum(bar.count for bar in drawn.bars) == 4 and drawn.undated == 1
    assert [bar.start.second % 10 for bar in drawn.bars] == [0] * len(drawn.bars)
    assert drawn.bars[-1].start <= NOW < drawn.bars[-1].start + drawn.step
    assert drawn.most == 2 and drawn.top == 2
    assert [tick.label for tick in drawn.counts] == ["0", "1", "2"]
    labels = [tick.label for tick in drawn.times]
    assert 2 <= len(labels) <= chart.MOST_TICKS
    assert labels == ["11:32", "11:33", "11:34"]  # every minute: a round time, seconds left out
    xs = [tick.at for tick in drawn.times]
    assert xs == sorted(xs) and xs[0] >= chart.LEFT


def test_a_long_span_is_labelled_by_date_and_a_big_count_by_a_round_scale() -> None:
    moments = [NOW - 8 * D] + [NOW - H] * 37
    drawn = chart.arrivals(moments, NOW)
    assert drawn is not None and drawn.step == 12 * H
    assert drawn.top == 50 and [tick.label for tick in drawn.counts] == ["0", "25", "50"]
    dates = [tick.label for tick in drawn.times]
    assert dates and all(re.fullmatch(r"(Nov|Dec) \d\d", label) for label in dates), dates
    gaps = [b.at - a.at for a, b in zip(drawn.times, drawn.times[1:], strict=False)]
    assert all(gap >= 4 * chart.BAR for gap in gaps), gaps  # room for "Dec 07": no overlap
    assert max(bar.height for bar in drawn.bars) == round(chart.HEIGHT * 37 / 50)
    assert chart.arrivals([None], NOW) is None


async def test_the_page_draws_a_round_bucket_with_an_axis_of_times_and_counts(
    db: DbConnection,
    schema: str,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
) -> None:
    await declare(channel, queue_name, FAST_RETRY, settings.amqp)
    now_ms = int(time.time() * 1000)
    # Two letters in one 10 s bar (bars start on round times): 1 and 2 s into the
    # bar that holds the time a minute ago, whatever the second the test starts at.
    minute_ago_bar = (now_ms - 60_000) // 10_000 * 10_000
    arrived = (now_ms - 175_000, minute_ago_bar + 1_000, minute_ago_bar + 2_000, now_ms)
    for n, at_ms in enumerate(arrived):
        headers = {"x-reason": "held_back", DEAD_LETTERED_AT_HEADER: at_ms}
        await publish(channel, dead_letter_queue(queue_name), f"order-{n}", {"n": n}, headers)
    tokens = await make_tokens(db, schema)
    async with (
        console_in_process(settings, queue_name) as url,
        httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {tokens.read}"}) as http,
    ):
        for path, params in (("/", {}), ("/letters", {"queue": queue_name})):
            page = (await http.get(path, params=params)).text
            svg = page[page.index("<svg") : page.index("</svg>")]
            assert "Arrivals per 10 s" in page, page
            times = re.findall(r'<text class="time"[^>]*>(\d\d:\d\d(?::[0-5]0)?)</text>', svg)
            counts = re.findall(r'<text class="count"[^>]*>(\d+)</text>', svg)
            assert len(times) >= 2, svg
            assert counts == ["0", "1", "2"], svg
