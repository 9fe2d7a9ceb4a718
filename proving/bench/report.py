"""The bench's table and its one-line summary, all figures from the same run.

Anchors: `ceiling`, timed by the stopwatch like every variant measured
against it, and `bare`, timed from outside with no instrument in its process
(`proving.bench.untimed`). `framework/bare` is the ratio a user sees;
`framework/ceiling` compares two consumers that pay the same instrument.
At our own layer (`proving.bench.anchors`): `aiormq`, aiormq's consumer with
no database, and `handwritten`, aiormq and asyncpg doing the framework's
durable work by hand; `framework/handwritten` is what the framework costs
over the best code written by hand at its layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from proving.bench.rounds import Result
from proving.bench.stopwatch import Timing

LINE_RATES = (
    "ceiling",
    "bare",
    "aiormq",
    "handwritten",
    "naive",
    "faststream",
    "framework",
    "framework_batch",
)
LINE_RATIOS = (
    ("framework", "ceiling"),
    ("framework", "bare"),
    ("framework", "aiormq"),
    ("framework", "handwritten"),
    ("framework_batch", "handwritten"),
    ("framework_batch", "ceiling"),
    ("framework_batch", "bare"),
    ("framework", "faststream"),
    ("framework_batch", "faststream"),
)


def _ratio(results: Mapping[str, Result], top: str, bottom: str) -> str:
    if top not in results or bottom not in results or not results[bottom].rate:
        return "n/a"
    return f"{results[top].rate / results[bottom].rate:.2f}"


def _share(result: Result, anchor: Result | None) -> str:
    return f"{result.rate / anchor.rate:.2f}" if anchor and anchor.rate else "n/a"


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def table(results: Mapping[str, Result]) -> str:
    ceiling, bare = results.get("ceiling"), results.get("bare")
    rows = [
        f"{'variant':<20} {'msg/s':>8} {'runs (msg/s)':<26} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'rss MB':>7} {'/ceiling':>8} {'/bare':>6}  what",
    ]
    for name, result in results.items():
        runs = " ".join(f"{t.rate:,.0f}" for t in result.timings)
        rows.append(
            f"{name:<20} {result.rate:>8,.0f} {runs:<26} {_ms(result.p50_ms):>8}"
            f" {_ms(result.p99_ms):>8} {result.peak_mb:>7.0f} {_share(result, ceiling):>8}"
            f" {_share(result, bare):>6}  {result.variant.what}"
        )
    return "\n".join(rows)


def summary(results: Mapping[str, Result]) -> str:
    """`bench: ceiling=… bare=… naive=… … framework/ceiling=… framework/bare=… …`."""
    parts = [
        f"{name}={results[name].rate:.0f}" if name in results else f"{name}=n/a"
        for name in LINE_RATES
    ]
    parts += [f"{top}/{bottom}={_ratio(results, top, bottom)}" for top, bottom in LINE_RATIOS]
    return "bench: " + " ".join(parts)


def paced_line(rate: float, timings: Mapping[str, Timing], *, fixed: bool = False) -> str:
    """`paced: rate=… ceiling p50=…ms p99=…ms ran=…% waited=…% framework …`."""
    parts = [
        f"{name} p50={_ms(t.p50_ms)}ms p99={_ms(t.p99_ms)}ms {t.cpu_shares()}".rstrip()
        for name, t in timings.items()
    ]
    source = "--paced-rate" if fixed else "half of framework"
    return f"paced: rate={rate:.0f} msg/s ({source}) " + " ".join(parts)


def prefill_line(
    rows: int, seconds: float, empty: Mapping[str, Result], full: Mapping[str, Result]
) -> str:
    parts = []
    for name, result in full.items():
        before = empty.get(name)
        share = f"{result.rate / before.rate:.2f}" if before and before.rate else "n/a"
        parts.append(f"{name}={result.rate:.0f} ({share} of empty)")
    return f"prefill: rows={rows} filled_in={seconds:.0f}s " + " ".join(parts)
