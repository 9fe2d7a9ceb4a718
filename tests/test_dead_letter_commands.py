"""`dlq list`, `dlq show` and `inspect` over every kind of dead letter the worker makes.

One message per reason the decode fuzz produces (every `BadInput` but
`fingerprint_failed`, which needs the app's own fingerprint function), plus
one the handler rejects, is published raw to a real worker, which
dead-letters each. Then the three commands run as real processes over each
dead letter: none crashes, `dlq show` and `inspect` find every one by its
id as `dlq list` prints it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

import aio_pika
import pytest

from consumers import REASON_HEADER, BadInput
from dedupe import DbConnection
from proving.rawamqp import RawProperties, RawPublisher
from tests.conftest import AMQP_URL, DATABASE_URL, Spawn
from tests.support import ROOT, wait_declared, wait_for

MAX_BODY_BYTES = 4096
DEEP = 1_500  # past orjson's limit and Python's recursion limit, inside MAX_BODY_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class Letter:
    reason: str
    properties: RawProperties
    body: bytes = b'{"n": 1}'
    shown_as: str  # its message_id as `dlq list` prints it
    tenant_as: str = ""  # its tenant as printed


def _id(message_id: str) -> RawProperties:
    return RawProperties(message_id=message_id)


def _tenant(message_id: str, tenant: object) -> RawProperties:
    return RawProperties(message_id=message_id, headers={"x-tenant": tenant})  # type: ignore[dict-item]


LETTERS = [
    Letter(
        reason="body_too_large",
        properties=_id("large"),
        body=b'{"p": "' + b"x" * MAX_BODY_BYTES + b'"}',
        shown_as="large",
    ),
    Letter(reason="invalid_json", properties=_id("broken"), body=b"{not json", shown_as="broken"),
    Letter(
        reason="body_not_json_object", properties=_id("array"), body=b"[1, 2]", shown_as="array"
    ),
    Letter(
        reason="json_too_deep",
        properties=_id("deep"),
        body=b'{"a": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        shown_as="deep",
    ),
    Letter(reason="missing_message_id", properties=RawProperties(), shown_as="-"),
    Letter(reason="message_id_too_long", properties=_id("k" * 200), shown_as="k" * 200),
    Letter(
        reason="message_id_not_utf8",
        properties=RawProperties(message_id=b"order-\xff"),
        shown_as="-",
    ),
    Letter(reason="message_id_has_nul", properties=_id("order-\x00-1"), shown_as="order-\\x00-1"),
    Letter(
        reason="bad_tenant",
        properties=_tenant("int-tenant", 5),
        shown_as="int-tenant",
        tenant_as="5",
    ),
    Letter(
        reason="tenant_not_utf8",
        properties=_tenant("bad-tenant", b"\xfe"),
        shown_as="bad-tenant",
        tenant_as="\\xfe",
    ),
    Letter(
        reason="tenant_has_nul",
        properties=_tenant("nul-tenant", "acme\x00"),
        shown_as="nul-tenant",
        tenant_as="acme\\x00",
    ),
    Letter(
        reason="unsupported_content_type",
        properties=RawProperties(message_id="text", content_type="text/plain"),
        shown_as="text",
    ),
    Letter(
        reason="unsupported_content_encoding",
        properties=RawProperties(message_id="zipped", content_encoding="gzip"),
        shown_as="zipped",
    ),
    Letter(
        reason="no_such_order",
        properties=_id("refused"),
        body=b'{"reject": "no_such_order"}',
        shown_as="refused",
    ),
]


def cli(
    *args: str | bytes, schema: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """The real CLI; arguments may be bytes, as a shell passes what is pasted into it."""
    return subprocess.run(
        [sys.executable, "-m", "consumers", *args],
        env={
            "AMQP_URL": AMQP_URL,
            "DATABASE_URL": DATABASE_URL,
            "DATABASE_SCHEMA": schema,
            "PATH": "/usr/bin",
            **(env or {}),
        },
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )


def no_crash(done: subprocess.CompletedProcess[bytes], codes: tuple[int, ...] = (0,)) -> str:
    said = done.stdout.decode(errors="replace")
    assert done.returncode in codes and b"Traceback" not in done.stderr, (
        f"exit {done.returncode}\n{done.stderr.decode(errors='replace')[-3000:]}"
    )
    return said


def test_every_reason_the_fuzz_produces_is_here() -> None:
    fuzzed = {reason.value for reason in BadInput} - {BadInput.FINGERPRINT_FAILED.value}
    assert {letter.reason for letter in LETTERS} >= fuzzed


@pytest.fixture
async def dead_letters(
    db: DbConnection, queue_name: str, spawn: Spawn, channel: aio_pika.abc.AbstractChannel
) -> str:
    """`queue_name` with one dead letter of each of LETTERS in its DLQ, put there by a worker."""
    worker = spawn({"IW_MAX_BODY_BYTES": str(MAX_BODY_BYTES)})
    await wait_declared(AMQP_URL, queue_name)
    async with await RawPublisher.connect_url(AMQP_URL) as raw:
        for letter in LETTERS:
            raw.send(queue_name, letter.body, letter.properties)
        await raw.confirm()

    async def all_dead() -> bool:
        declared = await channel.declare_queue(f"{queue_name}.dlq", passive=True)
        return declared.declaration_result.message_count == len(LETTERS)

    await wait_for(all_dead, timeout=60)
    worker.terminate()
    await worker.expect_exit(0)
    return queue_name


async def test_dlq_list_and_show_never_crash_on_what_the_worker_dead_letters(
    dead_letters: str, schema: str
) -> None:
    queue = dead_letters
    listed = no_crash(cli("dlq", "list", queue, schema=schema))
    for letter in LETTERS:
        assert f"{letter.shown_as:<40} {letter.reason:<40}" in listed, listed
    assert f"held={len(LETTERS)} read={len(LETTERS)} listed={len(LETTERS)}" in listed
    for letter in LETTERS:  # one at a time: two readers of one DLQ would share its messages
        shown = no_crash(cli("dlq", "show", queue, letter.shown_as, schema=schema))
        assert f"  {REASON_HEADER}: {letter.reason}" in shown, (letter.reason, shown[-2000:])


async def test_inspect_never_crashes_on_what_the_worker_dead_letters(
    dead_letters: str, schema: str
) -> None:
    for letter in LETTERS:
        inspected = no_crash(
            cli(
                "inspect",
                "--tenant",
                letter.tenant_as,
                dead_letters,
                letter.shown_as,
                schema=schema,
            )
        )  # exit 0: a dead-letter copy was found
        assert "claim: none" in inspected and "copies=0" not in inspected, inspected


async def test_inspect_takes_a_message_id_that_is_not_utf8_as_pasted(
    dead_letters: str, schema: str
) -> None:
    done = cli("inspect", dead_letters, b"order-\xff", schema=schema)
    said = no_crash(done, (0, 1))
    assert "message_id=order-\\xff" in said and "not UTF-8" in said


# A replay of these is not tried: they have no key a replay could keep.
SKIPPED = {"missing_message_id", "message_id_not_utf8"}
RUNS = {"no_such_order"}  # decodes: only its handler refuses it, which no dry run can know
# A tenant that is not UTF-8 arrives as a long string's bytes; dead-lettered, it
# goes out (and so comes back) as a byte array, which the worker's decode calls a
# bad tenant: the dry run says what the worker will do, not what it did.
AGAIN_AS = {"tenant_not_utf8": "bad_tenant"}
OUTCOME_LINE = re.compile(r"^(\S+) +message_id=.* reason=(\S+)(?: again=(\S+))?")


def foretold(said: str) -> dict[str, tuple[str, str]]:
    """The dry run's lines: {the reason it was dead-lettered with: (outcome, again)}."""
    found = {}
    for line in said.splitlines():
        if (matched := OUTCOME_LINE.match(line)) is not None:
            found[matched[2]] = (matched[1], matched[3] or "")
    return found


def listed_reasons(said: str) -> list[str]:
    """The reasons `dlq list` printed (no message_id here holds a space)."""
    return sorted(line.split()[1] for line in said.splitlines()[1:-1])


async def test_a_dry_run_foretells_each_replay_the_worker_would_dead_letter_again_and_why(
    dead_letters: str, schema: str, spawn: Spawn, channel: aio_pika.abc.AbstractChannel
) -> None:
    queue = dead_letters
    limits = {"IW_MAX_BODY_BYTES": str(MAX_BODY_BYTES)}
    dry = no_crash(cli("dlq", "replay", queue, "--dry-run", schema=schema, env=limits))
    expected = {
        letter.reason: (
            ("skipped", "")
            if letter.reason in SKIPPED
            else ("would_replay", "")
            if letter.reason in RUNS
            else ("would_dead_letter_again", AGAIN_AS.get(letter.reason, letter.reason))
        )
        for letter in LETTERS
    }
    assert foretold(dry) == expected, dry

    # The worker agrees: replayed for real, each comes back with the reason foretold.
    worker = spawn(limits)
    await worker.wait_logged("worker_started")
    replayed = no_crash(cli("dlq", "replay", queue, schema=schema, env=limits))
    assert f"replayed={len(LETTERS) - len(SKIPPED)}" in replayed, replayed

    async def all_back() -> bool:
        declared = await channel.declare_queue(f"{queue}.dlq", passive=True)
        return declared.declaration_result.message_count == len(LETTERS)

    await wait_for(all_back, timeout=60)
    worker.terminate()
    await worker.expect_exit(0)
    after = no_crash(cli("dlq", "list", queue, schema=schema))
    assert listed_reasons(after) == sorted(again or was for was, (_, again) in expected.items())
