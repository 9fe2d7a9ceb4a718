"""`idempotent-workers dlq list|show|replay`: the commands, run as real processes.

Dead letters are put straight into `<queue>.dlq` with the headers a worker
(or a forger) would give them, then the CLI is run against the real broker.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aio_pika
import pytest
from yarl import URL

from consumers import AmqpSettings, RetryPolicy, dead_letter_queue
from consumers.broker.topology import declare
from consumers.pipeline.settle import DEAD_LETTERED_AT_HEADER
from dedupe import DbConnection, Retention, cleanup, generations
from dedupe.generations import PROCESSED_MESSAGES
from proving.rawamqp import RawProperties, RawPublisher, RawValue
from tests.conftest import AMQP_URL, DATABASE_URL, Spawn
from tests.support import ROOT, publish_confirmed, wait_declared, wait_for

DAY_MS = 86_400_000


class RawUtf8(str):
    """A header value that pamqp writes as these bytes: not UTF-8, as another client may send."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawUtf8:
        value = super().__new__(cls, "?")
        value.raw = raw
        return value

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


def run_cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "consumers", *args],
        env={"AMQP_URL": AMQP_URL, "DATABASE_URL": DATABASE_URL, "PATH": "/usr/bin", **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
async def topology(
    channel: aio_pika.abc.AbstractChannel, queue_name: str, retry_policy: RetryPolicy
) -> str:
    await declare(channel, queue_name, retry_policy, AmqpSettings(urls=(AMQP_URL,)))
    return queue_name


@pytest.fixture
async def other_queue(channel: aio_pika.abc.AbstractChannel) -> AsyncIterator[str]:
    name = f"test.other.{uuid.uuid4().hex[:12]}"
    await channel.declare_queue(name, durable=True)
    yield name
    await channel.queue_delete(name)


async def put_dead_letter(
    channel: aio_pika.abc.AbstractChannel,
    queue: str,
    message_id: str,
    *,
    reason: str = "max_attempts_exceeded:handler_error",
    age_ms: int = 0,
    body: bytes = b'{"n": 1}',
    headers: Mapping[str, Any] | None = None,
) -> None:
    all_headers: dict[str, Any] = {
        "x-reason": reason,
        "x-attempt": 3,
        "x-error": "RuntimeError('boom')",
        DEAD_LETTERED_AT_HEADER: int(time.time() * 1000) - age_ms,
        **(headers or {}),
    }
    await publish_confirmed(
        channel,
        aio_pika.Message(
            body,
            message_id=message_id,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers=all_headers,
        ),
        dead_letter_queue(queue),
    )


async def count(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    assert declared.declaration_result.message_count is not None
    return declared.declaration_result.message_count


async def ids_in(channel: aio_pika.abc.AbstractChannel, queue: str) -> list[str]:
    """Take every message of `queue` (acked) and return their message ids."""
    found = await channel.get_queue(queue, ensure=True)
    taken = []
    while (message := await found.get(no_ack=True, fail=False)) is not None:
        taken.append(message.message_id or "")
    return taken


async def test_replay_targets_the_queue_the_dlq_belongs_to_not_a_forged_header(
    channel: aio_pika.abc.AbstractChannel, topology: str, other_queue: str
) -> None:
    await put_dead_letter(channel, topology, "forged-1", headers={"x-original-queue": other_queue})
    done = run_cli("dlq", "replay", topology)
    assert done.returncode == 0, done.stderr
    assert await ids_in(channel, other_queue) == []
    assert await ids_in(channel, topology) == ["forged-1"]


async def test_replay_reports_and_skips_a_header_that_is_not_utf8(
    channel: aio_pika.abc.AbstractChannel, topology: str
) -> None:
    await put_dead_letter(channel, topology, "bad-header", headers={"x-note": RawUtf8(b"\xff\xfe")})
    await put_dead_letter(channel, topology, "good-1")
    for _ in range(2):  # a second run is not stopped by the same message either
        done = run_cli("dlq", "replay", topology)
        assert done.returncode == 0, done.stderr
        assert "skipped" in done.stdout and "bad-header" in done.stdout
        assert "x-note" in done.stdout
    assert await ids_in(channel, topology) == ["good-1"]
    assert await ids_in(channel, dead_letter_queue(topology)) == ["bad-header"]


async def test_replay_dry_run_changes_nothing_and_says_what_it_would_do(
    channel: aio_pika.abc.AbstractChannel, topology: str
) -> None:
    for n in range(3):
        await put_dead_letter(channel, topology, f"dry-{n}")
    done = run_cli("dlq", "replay", topology, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()[:3]] == ["would_replay"] * 3
    assert "replayed=0 would_replay=3" in done.stdout
    assert await count(channel, topology) == 0
    assert sorted(await ids_in(channel, dead_letter_queue(topology))) == ["dry-0", "dry-1", "dry-2"]


async def test_replay_filters_by_reason_message_id_since_and_limit(
    channel: aio_pika.abc.AbstractChannel, topology: str
) -> None:
    await put_dead_letter(channel, topology, "a", reason="max_attempts_exceeded:handler_error")
    await put_dead_letter(channel, topology, "b", reason="invalid_json")
    await put_dead_letter(channel, topology, "c", reason="max_attempts_exceeded:handler_error")
    await put_dead_letter(channel, topology, "old", reason="invalid_json", age_ms=2 * DAY_MS)
    await put_dead_letter(channel, topology, "d", reason="max_attempts_exceeded:timeout")

    assert (
        run_cli("dlq", "replay", topology, "--reason", "invalid_json", "--since", "1d").returncode
        == 0
    )
    assert await ids_in(channel, topology) == ["b"]
    assert run_cli("dlq", "replay", topology, "--message-id", "c").returncode == 0
    assert await ids_in(channel, topology) == ["c"]
    done = run_cli("dlq", "replay", topology, "--reason", "max_attempts_exceeded:*", "--limit", "1")
    assert done.returncode == 0, done.stderr
    assert await ids_in(channel, topology) == ["a"]
    left = await ids_in(channel, dead_letter_queue(topology))
    assert sorted(left) == ["d", "old"]


async def test_replay_refuses_a_message_older_than_retention_unless_forced(
    channel: aio_pika.abc.AbstractChannel, topology: str
) -> None:
    await put_dead_letter(channel, topology, "ancient", age_ms=8 * DAY_MS)
    done = run_cli("dlq", "replay", topology, env={"IW_RETENTION_DAYS": "7"})
    assert done.returncode == 0, done.stderr
    assert "refused" in done.stdout and "ancient" in done.stdout and "--force" in done.stdout
    assert await count(channel, topology) == 0
    done = run_cli("dlq", "replay", topology, "--force", env={"IW_RETENTION_DAYS": "7"})
    assert done.returncode == 0, done.stderr
    assert await ids_in(channel, topology) == ["ancient"]


async def test_list_and_show_escape_what_they_print(
    channel: aio_pika.abc.AbstractChannel, topology: str
) -> None:
    evil_id = "evil\x1b[2J\x1b]0;pwned\x07"
    await put_dead_letter(
        channel,
        topology,
        evil_id,
        headers={"x-error": "boom\x00\x1b[31mred", "x-tenant": "t\u202eenant"},
        body=b'{"text": "line\\u001b[1mbold"}',
    )
    listed = run_cli("dlq", "list", topology)
    assert listed.returncode == 0, listed.stderr
    assert not any(ch in listed.stdout for ch in "\x00\x07\x1b\u202e"), repr(listed.stdout)
    assert "evil\\x1b[2J" in listed.stdout
    shown = run_cli("dlq", "show", topology, evil_id)
    assert shown.returncode == 0, shown.stderr
    assert not any(ch in shown.stdout for ch in "\x00\x07\x1b\u202e"), repr(shown.stdout)
    assert "evil\\x1b[2J" in shown.stdout
    assert "boom\\x00\\x1b[31mred" in shown.stdout
    assert "t\\u202eenant" in shown.stdout
    assert "x-reason" in shown.stdout and "content_type" in shown.stdout
    assert '"text"' in shown.stdout
    # Reading did not take anything away.
    assert await count(channel, dead_letter_queue(topology)) == 1


async def test_worker_dates_its_dead_letters_so_a_replay_can_tell_their_age(
    db: DbConnection, channel: aio_pika.abc.AbstractChannel, queue_name: str, spawn: Spawn
) -> None:
    worker = spawn()
    await wait_declared(AMQP_URL, queue_name)
    before = int(time.time() * 1000)
    await publish_confirmed(
        channel, aio_pika.Message(b"not json", message_id="poison-1"), queue_name
    )

    async def dead_lettered() -> bool:
        return await count(channel, dead_letter_queue(queue_name)) == 1

    await wait_for(dead_lettered, timeout=60)
    worker.terminate()
    await worker.expect_exit(0)
    dlq = await channel.get_queue(dead_letter_queue(queue_name), ensure=True)
    letter = await dlq.get(no_ack=True)
    stamp = (letter.headers or {})[DEAD_LETTERED_AT_HEADER]
    assert isinstance(stamp, int) and before <= stamp <= int(time.time() * 1000)


async def test_replay_of_a_message_older_than_retention_is_refused_and_with_force_applies(
    db: DbConnection,
    schema: str,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
    spawn: Spawn,
) -> None:
    """The case retention exists for: a copy replayed after its claim was cleaned up."""
    worker = spawn()
    await wait_declared(AMQP_URL, queue_name)
    await publish_confirmed(
        channel,
        aio_pika.Message(b'{"n": 7}', message_id="order-7", content_type="application/json"),
        queue_name,
    )

    async def effects(n: int) -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM effects") == n)

    await wait_for(lambda: effects(1), timeout=60)
    # A copy of the same job dead-lettered 8 days ago, and retention (7 days)
    # has since dropped the generation holding the job's claim.
    await put_dead_letter(channel, queue_name, "order-7", body=b'{"n": 7}', age_ms=8 * DAY_MS)
    await generations.rotate(db, schema, PROCESSED_MESSAGES)
    await db.execute(
        "UPDATE dedupe_generations SET ended_at = now() - interval '8 days'"
        " WHERE family = 'processed_messages' AND generation = 0"
    )
    await db.execute("ANALYZE processed_messages_g0")
    deleted = await cleanup(db, schema, Retention(keep=datetime.timedelta(days=7)))
    assert (deleted.generations_dropped, deleted.processed_messages) == (1, 1)

    refused = run_cli("dlq", "replay", queue_name, env={"IW_RETENTION_DAYS": "7"})
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.startswith("refused") and "replayed=0" in refused.stdout
    assert await count(channel, dead_letter_queue(queue_name)) == 1

    forced = run_cli("dlq", "replay", queue_name, "--force", env={"IW_RETENTION_DAYS": "7"})
    assert forced.returncode == 0, forced.stderr
    assert "replayed=1" in forced.stdout
    # What --force risks, shown: with the claim gone, the effect applies again.
    await wait_for(lambda: effects(2), timeout=60)
    worker.terminate()
    await worker.expect_exit(0)


async def test_a_property_or_header_name_that_is_not_utf8_stops_nothing(
    channel: aio_pika.abc.AbstractChannel, topology: str
) -> None:
    """pamqp cannot read either: the connection used to drop, and every run stopped there."""
    now_ms = int(time.time() * 1000)
    dated: dict[bytes | str, RawValue] = {DEAD_LETTERED_AT_HEADER: now_ms, "x-reason": "r"}
    broker = URL(AMQP_URL)
    async with await RawPublisher.connect(host=broker.host or "", port=broker.port or 5672) as raw:
        dlq = dead_letter_queue(topology)
        await raw.publish(dlq, b"{}", RawProperties(message_id=b"id-\xff", headers=dated))
        bad_key = {**dated, b"x-\xfe": "v"}
        await raw.publish(dlq, b"{}", RawProperties(message_id=b"bad-key", headers=bad_key))
        await raw.publish(dlq, b"{}", RawProperties(message_id=b"fine", headers=dated))
    listed = run_cli("dlq", "list", topology)
    assert listed.returncode == 0, listed.stderr
    assert "id-\\xff" in listed.stdout and "listed=3" in listed.stdout
    for _ in range(2):
        done = run_cli("dlq", "replay", topology)
        assert done.returncode == 0, done.stderr
        assert "property message_id is not UTF-8" in done.stdout
        assert "header x-\\xfe is not UTF-8" in done.stdout
    assert await ids_in(channel, topology) == ["fine"]
    assert await count(channel, dead_letter_queue(topology)) == 2


async def test_replay_dry_run_tells_a_no_op_from_a_run_by_the_claim(
    db: DbConnection,
    schema: str,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
    spawn: Spawn,
) -> None:
    """The same function the console's dry run calls: a copy whose effect committed is a no-op."""
    worker = spawn()
    await wait_declared(AMQP_URL, queue_name)
    await publish_confirmed(
        channel,
        aio_pika.Message(b'{"n": 9}', message_id="order-9", content_type="application/json"),
        queue_name,
    )

    async def committed() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM effects") == 1)

    await wait_for(committed, timeout=60)
    worker.terminate()
    await worker.expect_exit(0)
    await put_dead_letter(channel, queue_name, "order-9", body=b'{"n": 9}')
    await put_dead_letter(channel, queue_name, "order-10", body=b'{"n": 10}')
    await put_dead_letter(channel, queue_name, "order-9", body=b'{"n": 99}')  # reused id

    done = run_cli("dlq", "replay", queue_name, "--dry-run", env={"DATABASE_SCHEMA": schema})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("would_be_duplicate message_id=order-9")
    assert "a replay would be a no-op" in lines[0]
    assert lines[1].startswith("would_replay  message_id=order-10")
    assert lines[2].startswith("would_dead_letter_again message_id=order-9")
    assert "again=message_id_reused" in lines[2], lines[2]
    assert "would_replay=1 would_be_duplicate=1 would_dead_letter_again=1" in done.stdout
    assert await count(channel, dead_letter_queue(queue_name)) == 3


async def test_archive_takes_only_the_chosen_dead_letters_and_only_when_told_yes(
    channel: aio_pika.abc.AbstractChannel, topology: str
) -> None:
    await put_dead_letter(channel, topology, "keep-1", reason="bad_json")
    await put_dead_letter(
        channel, topology, "drop-1", headers={"x-tenant": "acme"}, body=b'{"n": "\xe2\x80\xae"}'
    )
    await put_dead_letter(channel, topology, "drop-2", headers={"x-tenant": "other"})

    unsure = run_cli("dlq", "archive", topology, "--tenant", "acme")
    assert unsure.returncode == 2 and "--yes" in unsure.stderr
    assert await count(channel, dead_letter_queue(topology)) == 3

    done = run_cli("dlq", "archive", topology, "--tenant", "acme", "--yes")
    assert done.returncode == 0, done.stderr
    assert "archived=1" in done.stderr
    assert sorted(await ids_in(channel, dead_letter_queue(topology))) == ["drop-2", "keep-1"]
    # Where `dlq archive --help` says they are kept: one JSON line each on standard output,
    # whole, and safe on a terminal (the bidi override of the body is an escape).
    [line] = done.stdout.splitlines()
    assert line.isascii() and line.isprintable(), repr(line)
    kept = json.loads(line)
    assert kept["message_id"] == "drop-1" and kept["tenant"] == "acme"
    assert kept["body"] == '{"n": "\u202e"}'
    assert kept["headers"]["x-tenant"] == "acme"
    assert kept["headers"]["x-reason"] == "max_attempts_exceeded:handler_error"
    assert kept["properties"]["content_type"] == "application/json"


def test_archive_help_says_where_the_archived_messages_are_kept() -> None:
    top = run_cli("--help")
    assert "list, show, replay or archive dead letters" in " ".join(top.stdout.split())
    said = " ".join(run_cli("dlq", "archive", "--help").stdout.split())
    assert "printed whole (properties, headers, body) as one JSON line on standard output" in said
    assert "deleted" not in said


async def test_replay_dry_run_parses_a_rejected_push_job_again_with_the_workers_parser(
    channel: aio_pika.abc.AbstractChannel, topology: str
) -> None:
    await put_dead_letter(channel, topology, "push-1", reason="invalid_push_job", body=b"{}")
    fixed = json.dumps(
        {"targets": [{"platform": "ios", "token": "ab12"}], "notification": {"title": "Hi"}}
    )
    await put_dead_letter(
        channel, topology, "push-2", reason="invalid_push_job", body=fixed.encode()
    )

    done = run_cli("dlq", "replay", topology, "--dry-run")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()[:2]
    assert first.startswith("would_dead_letter_again message_id=push-1"), first
    assert "again=invalid_push_job targets: a non-empty list is required" in first, first
    # A body the parser takes now (its rules loosened since, say) would run.
    assert second.startswith("would_replay  message_id=push-2"), second
    assert await count(channel, dead_letter_queue(topology)) == 2
