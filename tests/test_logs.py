"""Outcome lines: the fast path writes the bytes structlog's JSON chain writes."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import cast

import orjson
import pytest
import structlog

from consumers import (
    App,
    Context,
    Envelope,
    Publisher,
    Settings,
    Worker,
    configure_logging,
    parse_push_job,
)
from consumers.effects.answers import Answered, Send, log_answer
from consumers.jobs.kind import Recipient
from consumers.jobs.push import PUSH
from consumers.pipeline.deliveries import Delivery, Item
from consumers.telemetry.logs import outcome_lines
from dedupe import DbConnection, DedupeKey, SendResult, SendStatus, TargetKey
from providers import Platform, Target, send_ids
from tests.support import wait_for

STAMP = re.compile(rb'"timestamp": ?"[^"]+"')


def _configure(level: str, *, json: bool, file: io.BytesIO | None = None) -> None:
    """configure_logging, but loggers first used in the test are not cached.

    configure_logging caches a logger on first use, with the processor chain
    of that moment: one first used here would keep this test's set-up (and
    its buffer) in every later test, out of reach of capture_logs.
    """
    configure_logging(level, json=json, file=file)
    structlog.configure(cache_logger_on_first_use=False)


@pytest.fixture
def json_log() -> Iterator[io.BytesIO]:
    """configure_logging's JSON set-up writing into a buffer; structlog restored after."""
    before = structlog.get_config()
    out = io.BytesIO()
    _configure("info", json=True, file=out)
    yield out
    structlog.configure(**before)


def _fields() -> dict[str, object]:
    return {
        "consumer": "orders",
        "tenant": "acme",
        "message_id": "m-1",
        "attempt": 2,
        "duration_ms": 3.25,
        "reason": "handler_error",
        "error": "ValueError: ünïcode",
        "big": 2**70,  # orjson refuses it: both fall back to json.dumps
    }


def test_fast_lines_are_the_json_chains_bytes(json_log: io.BytesIO) -> None:
    structlog.get_logger("t").warning("retry_scheduled", **_fields())
    structlog.get_logger("t").info("effect_committed", **_fields())
    by_structlog = json_log.getvalue()
    json_log.seek(0)
    json_log.truncate()

    lines = outcome_lines()
    assert lines is not None
    lines.line("retry_scheduled", "warning", _fields())
    lines.line("effect_committed", "info", _fields())
    assert json_log.getvalue() == b""  # nothing written before flush
    lines.flush()

    assert STAMP.sub(b"", json_log.getvalue()) == STAMP.sub(b"", by_structlog)
    assert by_structlog.count(b"\n") == 2


def test_fast_lines_honour_the_configured_level() -> None:
    before = structlog.get_config()
    out = io.BytesIO()
    _configure("warning", json=True, file=out)
    try:
        lines = outcome_lines()
        assert lines is not None
        lines.line("effect_committed", "info", _fields())
        lines.line("dead_lettered", "warning", _fields())
        lines.flush()
    finally:
        structlog.configure(**before)
    events = [orjson.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert events == ["dead_lettered"]


def test_no_fast_path_when_context_is_bound_or_structlog_reconfigured(
    json_log: io.BytesIO,
) -> None:
    assert outcome_lines() is not None
    with structlog.contextvars.bound_contextvars(request_id="r-1"):
        assert outcome_lines() is None
    with structlog.testing.capture_logs():
        assert outcome_lines() is None
    _configure("info", json=False)
    assert outcome_lines() is None


async def test_a_worker_writes_one_json_line_per_outcome(
    json_log: io.BytesIO,
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
) -> None:
    app = App()

    @app.handler(queue_name)
    async def record(ctx: Context) -> None:
        await ctx.stage(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ($1, $2, $3, '', 0)",
            ctx.consumer,
            ctx.tenant,
            ctx.message_id,
        )

    async with Worker(app, settings):
        for n in range(3):
            await publisher.publish(queue_name, {"n": n}, message_id=f"line-{n}")
        await publisher.publish(queue_name, {"n": 0}, message_id="line-0")

        async def logged() -> bool:
            return json_log.getvalue().count(b'"consumer"') >= 4

        await wait_for(logged, timeout=30)
    outcomes = [
        (line["event"], line["message_id"], line["level"])
        for line in map(orjson.loads, json_log.getvalue().splitlines())
        if "message_id" in line
    ]
    assert sorted(outcomes) == [
        ("duplicate_ignored", "line-0", "info"),
        ("effect_committed", "line-0", "info"),
        ("effect_committed", "line-1", "info"),
        ("effect_committed", "line-2", "info"),
    ]


def test_fast_push_sent_line_is_the_json_chains_bytes(json_log: io.BytesIO) -> None:
    key = DedupeKey(consumer="pushes", tenant="acme", message_id="order-1042-shipped")
    envelope = Envelope(key=key, body={}, fingerprint=b"", attempt=2)
    device = Target(platform=Platform.IOS, token="ios-token-aaaaaaaaaaaa")
    send = Send(
        item=Item(delivery=cast(Delivery, None), envelope=envelope),  # the line reads no delivery
        job=parse_push_job({"targets": [{"platform": "ios", "token": device.token}]}),
        target=TargetKey(key=key, target_index=0),
        recipient=Recipient(channel=str(device.platform), address=device.token),
        ids=send_ids("k", device.token),
        provider="apns",
    )
    result = SendResult(target=send.target, status=SendStatus.SENT, provider_message_id="p-1")
    answer = Answered(send=send, result=result)
    log_answer(answer, consumer="pushes", kind=PUSH, recorded=True)
    by_structlog = json_log.getvalue()
    json_log.seek(0)
    json_log.truncate()

    lines = outcome_lines()
    assert lines is not None
    log_answer(answer, consumer="pushes", kind=PUSH, recorded=True, lines=lines)
    lines.flush()

    assert STAMP.sub(b"", json_log.getvalue()) == STAMP.sub(b"", by_structlog)
    assert b'"push_sent"' in by_structlog


def test_the_lines_bench_times_the_same_bytes_both_ways(json_log: io.BytesIO) -> None:
    """`proving.bench.lines` compares two ways of writing one batch: both must write
    what the JSON chain would, or its ratio measures different work."""
    from proving.bench.lines import HeldLines, fields

    appended = outcome_lines()
    assert appended is not None
    held = HeldLines(appended)
    written = []
    for lines in (held, appended):
        for n in range(3):
            lines.line("push_sent", "info", fields(n))
        lines.flush()
        written.append(STAMP.sub(b"", json_log.getvalue()))
        json_log.seek(0)
        json_log.truncate()
    for n in range(3):
        structlog.get_logger("t").info("push_sent", **fields(n))
    assert written[0] == written[1] == STAMP.sub(b"", json_log.getvalue())
    assert written[0].count(b"\n") == 3
