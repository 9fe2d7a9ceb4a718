"""The bench's code paths, on a few messages: every variant, paced mode, prefill.

No figure is checked here (a benchmark is a command that prints figures);
what is checked is that each variant consumes everything, that the writing
ones leave exactly one effect per message, that a progress line comes out
per run, and that the summary line is there.
"""

from __future__ import annotations

import random
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import aio_pika
import aiormq.connection
import pytest
from asyncpg.transaction import Transaction

from consumers import Settings
from consumers.broker.frames import AIORMQ_RECEIVER, BufferedFrameReceiver
from consumers.pipeline.batch import BatchRunner
from consumers.pipeline.settle import Dispatcher
from dedupe.inbox import Inbox
from proving.bench import bench, schedstat
from proving.bench.options import (
    ALL_VARIANTS,
    DEFAULT_VARIANTS,
    LONG_MESSAGES,
    MESSAGES,
    SLOW_MESSAGES,
    SLOW_VARIANTS,
    parse,
)
from proving.bench.pacer import publish_paced
from proving.bench.stopwatch import Stopwatch, Timing
from proving.bench.workload import job
from proving.deadlines import ANSWER_S, within
from tests.conftest import AMQP_URL


async def test_every_variant_consumes_everything_once(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    options = parse(
        [
            *("--variants", ",".join(ALL_VARIANTS), "--messages", "60", "--repeats", "1"),
            *("--paced-seconds", "1", "--prefill", "2000"),
        ]
    )
    assert await bench(options, settings) == 0
    out = capsys.readouterr().out
    for variant in ALL_VARIANTS:
        assert f" {variant} " in out, out
    assert "EFFECTS WRONG" not in out, out
    assert "bench: ceiling=" in out and "framework/faststream=" in out, out
    assert "paced: rate=" in out, out
    paced = next(line for line in out.splitlines() if line.startswith("paced: rate="))
    assert re.search(r" framework p50=\S+ p99=\S+ ran=\d+% waited=\d+%", paced), paced
    assert "prefill: rows=2000" in out, out
    assert "framework/ceiling=" in out and " framework/bare=" in out, out
    assert "bench: done in " in out, out


async def test_a_fixed_paced_rate_paces_there_without_the_framework(
    settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--paced-rate`: two commits compared at one rate (the default, half the
    framework's rate, paces a faster run harder). With no framework variant to
    connect first, the ceiling reads through the worker's frame reader all the same."""
    monkeypatch.setattr(aiormq.connection, "FrameReceiver", AIORMQ_RECEIVER)
    options = parse(
        [
            *("--variants", "ceiling", "--messages", "60", "--repeats", "1"),
            *("--paced-seconds", "1", "--paced-rate", "300"),
        ]
    )
    assert await bench(options, settings) == 0
    out = capsys.readouterr().out
    paced = next(line for line in out.splitlines() if line.startswith("paced: rate="))
    assert paced.startswith("paced: rate=300 msg/s (--paced-rate) ceiling p50="), paced
    assert "at 300 msg/s (300 sent, the pacer on a CPU " in out, out
    assert aiormq.connection.FrameReceiver is BufferedFrameReceiver
    with pytest.raises(SystemExit):
        parse(["--paced-rate", "0"])


async def test_phases_time_every_paced_batch_and_put_the_worker_back(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--phases`: one line per paced framework run, each phase timed over the
    batches of the run; the wrapped calls are the worker's own again after."""

    def wrapped() -> tuple[object, ...]:
        return (
            BatchRunner.run,
            BatchRunner._effects_fast,
            Transaction.start,
            Transaction.commit,
            Inbox.claim,
            Dispatcher.settle,
        )

    originals = wrapped()
    options = parse(
        [
            *("--variants", "ceiling,framework", "--messages", "60", "--repeats", "1"),
            *("--paced-seconds", "1", "--paced-rate", "300", "--phases"),
        ]
    )
    assert await bench(options, settings) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("phases: ")]
    assert len(lines) == 1 and lines[0].startswith("phases: framework at 300 msg/s: "), out
    found = re.search(r": ([\d,]+) batches of \S+ messages \(median\), slot busy \d+%", lines[0])
    assert found and int(found[1].replace(",", "")) > 1, lines[0]
    for phase in ("wait", "decode", "begin", "claim", "effects", "commit", "settle", "batch"):
        assert re.search(rf" {phase} \d+\.\d/\d+\.\d", lines[0]), (phase, lines[0])
    batch = re.search(r" batch \d+\.\d/(\d+\.\d)", lines[0])
    slowest = re.search(
        r"; slowest (\d+\.\d) ms, \d+ messages?, \d+\.\d s in: wait \d+\.\d decode", lines[0]
    )
    assert batch and slowest and float(slowest[1]) >= float(batch[1]), lines[0]
    assert wrapped() == originals


def _rate(out: str, variant: str) -> float:
    """The msg/s of `variant`'s first progress line, `run VARIANT 1/1 N msgs R msg/s ...`."""
    for line in out.splitlines():
        fields = line.split()
        if fields[:3] == ["run", variant, "1/1"]:
            assert fields[4:7:2] == ["msgs", "msg/s"] and " at " in line, line
            return float(fields[5].replace(",", ""))
    raise AssertionError(f"no progress line of {variant}:\n{out}")


async def test_bare_is_timed_from_outside_and_set_beside_the_framework(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # A backlog past the prefetch window, so the queue's depth gives bare a rate.
    options = parse(
        [
            *("--variants", "bare,framework", "--messages", "400", "--prefetch", "50"),
            *("--repeats", "1", "--paced-seconds", "0"),
        ]
    )
    assert await bench(options, settings) == 0
    out = capsys.readouterr().out
    assert _rate(out, "bare") > 0 and _rate(out, "framework") > 0, out
    summary = next(line for line in out.splitlines() if line.startswith("bench: ceiling="))
    ratio = summary.split(" framework/bare=")[1].split()[0]
    assert float(ratio) > 0, summary


def test_the_default_runs_the_slow_ones_on_fewer_messages_and_long_all_on_all() -> None:
    default, long_form, small = parse([]), parse(["--long"]), parse(["--messages", "60"])
    assert (default.messages, default.slow_messages) == (MESSAGES, SLOW_MESSAGES)
    assert SLOW_MESSAGES < MESSAGES and set(SLOW_VARIANTS) <= set(ALL_VARIANTS)
    assert set(DEFAULT_VARIANTS) < set(ALL_VARIANTS) and "bare" in default.variants
    assert (long_form.messages, long_form.slow_messages) == (LONG_MESSAGES, LONG_MESSAGES)
    assert long_form.variants == ALL_VARIANTS
    assert (small.messages, small.slow_messages) == (60, 60)
    assert parse(["--slow-messages", "30"]).slow_messages == 30


def test_schedstat_counts_this_threads_time_on_a_cpu() -> None:
    """What the paced line's ran= and waited= are read from, checked against the
    kernel's other count of the same thread's CPU time."""
    before, cpu_before = schedstat.read(), time.thread_time()
    assert before is not None  # Linux, where the bench runs
    while time.thread_time() - cpu_before < 0.2:
        pass
    after, cpu_after = schedstat.read(), time.thread_time()
    assert after is not None
    spent = after - before
    assert spent.waited >= 0
    assert spent.ran == pytest.approx(cpu_after - cpu_before, abs=0.02)
    timing = Timing(messages=1, seconds=spent.ran + spent.waited, cpu=spent)
    assert re.fullmatch(r"ran=\d+% waited=\d+%", timing.cpu_shares())
    assert Timing(messages=1, seconds=1.0).cpu_shares() == ""


def test_schedstat_reads_another_process_time_on_a_cpu() -> None:
    """What the push bench's `fake ran=` is read from: a child's own count of its CPU
    time against the kernel's, read from here while the child waits."""
    spin = (
        "import sys, time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\n"
        "print(time.process_time(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], ANSWER_S)
        assert ready, f"the child printed nothing within {ANSWER_S:.0f} s"
        own = float(child.stdout.readline())  # once it spun (or '' if it died: fails)
        counted = schedstat.of_process(child.pid)
    finally:
        child.communicate(timeout=ANSWER_S)
    assert counted is not None
    assert counted.ran == pytest.approx(own, abs=0.05)
    assert schedstat.of_process(child.pid) is None  # reaped: nothing to read


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


async def test_the_cleanup_bench_drops_a_generation_at_each_size_with_no_delete(
    settings: Settings,
) -> None:
    from proving.bench.cleanup import bench as cleanup_bench

    line = await cleanup_bench(settings.database.url, [0, 2000], repeats=2)
    assert line.startswith("cleanup: rows=0 ms="), line
    assert " rows=2000 ms=" in line and " ratio=" in line, line
    assert line.endswith(" deletes=0"), line


async def test_the_steady_bench_measures_both_phases(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from proving.bench.steady import main_async
    from proving.bench.steady import parse as parse_steady

    options = parse_steady(
        [
            *("--rows", "3000", "--messages", "60", "--repeats", "1"),
            *("--database-url", settings.database.url),
        ]
    )
    assert await main_async(options, settings) == 0
    out = capsys.readouterr().out
    for phase in ("empty", "prefilled"):
        for variant in ("handwritten", "framework"):
            assert f"steady: phase={phase} " in out and f" variant={variant} " in out, out
    assert "phase=prefilled rows=3" in out, out  # 3,000 and the empty phase's last claims
    assert re.search(r"steady: framework prefilled/empty at rows=\d+: rate=\S+ p99=", out), out
    assert "WRONG" not in out, out


async def test_the_pacer_publishes_each_job_as_basic_publish_would(
    queue_name: str, channel: aio_pika.abc.AbstractChannel
) -> None:
    """The pacer writes bytes it marshalled before its clock: what arrives is every
    job of its seed, in order, with the body and properties `workload.job` gives."""
    queue = await channel.declare_queue(queue_name, auto_delete=False)
    rate, seconds, seed = 400.0, 0.5, 7
    sent, cpu_seconds = await publish_paced(
        AMQP_URL, queue_name, rate=rate, seconds=seconds, seed=seed
    )
    assert sent == 200
    assert 0 < cpu_seconds < ANSWER_S
    rng = random.Random(seed)
    for n in range(sent):
        expected = job(n, rng)
        got = await within(ANSWER_S, "a paced job", queue.get(no_ack=True))
        assert got is not None, f"job {n} of {sent} missing"
        assert got.body == expected.body
        assert got.message_id == expected.message_id
        assert got.content_type == expected.content_type
        assert got.delivery_mode == expected.delivery_mode
        assert got.headers == expected.headers
    assert await queue.get(no_ack=True, fail=False) is None  # nothing more
