"""The bench's code paths, on a few messages: every variant, paced mode, prefill.

No figure is checked here (a benchmark is a command that prints figures);
what is checked is that each variant consumes everything, that the writing
ones leave exactly one effect per message, and that the summary line is there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers import Settings
from proving.bench import bench
from proving.bench.options import DEFAULT_VARIANTS, parse
from proving.bench.stopwatch import Stopwatch
from proving.bench.workload import job


async def test_every_variant_consumes_everything_once(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    options = parse(
        ["--messages", "60", "--repeats", "1", "--paced-seconds", "1", "--prefill", "2000"]
    )
    assert await bench(options, settings) == 0
    out = capsys.readouterr().out
    for variant in DEFAULT_VARIANTS:
        assert f" {variant} " in out, out
    assert "EFFECTS WRONG" not in out, out
    assert "bench: ceiling=" in out and "framework/faststream=" in out, out
    assert "paced: rate=" in out, out
    assert "prefill: rows=2000" in out, out


def test_the_stopwatch_leaves_aio_pika_as_it_found_it() -> None:
    from aio_pika.message import IncomingMessage

    before = (IncomingMessage.__init__, IncomingMessage.ack)
    with Stopwatch().installed():
        assert (IncomingMessage.__init__, IncomingMessage.ack) != before
    assert (IncomingMessage.__init__, IncomingMessage.ack) == before


def test_jobs_are_about_300_bytes_of_json() -> None:
    import random

    sizes = [len(job(n, random.Random(n)).body) for n in range(100)]
    assert min(sizes) >= 250 and max(sizes) <= 350


def test_options_refuse_unknown_variants() -> None:
    with pytest.raises(SystemExit):
        parse(["--variants", "ceiling,nonsense"])


async def test_scale_runs_every_setup_and_prints_the_scale_line(
    settings: Settings, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from proving.bench.scale import scale

    options = parse(["--scale", "--messages", "200", "--repeats", "1", "--timeout", "120"])
    with (tmp_path / "scale.log").open("wb") as log:
        assert await scale(options, settings, log) == 0
    out = capsys.readouterr().out
    for setup in ("processes=1", "processes=2", "bare_1", "bare_2"):
        assert f" {setup} " in out, out
    assert out.count("effects ok") == 2, out
    assert "scale: processes=1 rate=" in out and " two/bare_2=" in out, out


async def test_the_cleanup_bench_deletes_every_expired_row_at_each_size(settings: Settings) -> None:
    from proving.bench.cleanup import bench as cleanup_bench

    line = await cleanup_bench(settings.database.url, [0, 2000], expired=1200, batch=500, repeats=1)
    assert line.startswith("cleanup: deleted=1200 batch=500 rows=0 us_per_row="), line
    assert " rows=2000 us_per_row=" in line and " ratio=" in line, line
