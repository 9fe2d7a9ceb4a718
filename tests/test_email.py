"""E-mail jobs through the send ledger: aiosmtplib against a real SMTP server (aiosmtpd).

Every recipient is one effect with a Message-ID of its own, the same on every
attempt; the fake counts arrivals by Message-ID.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import aio_pika
import pytest

from consumers import (
    REASON_HEADER,
    App,
    Context,
    Publisher,
    Reject,
    Relay,
    RelaySettings,
    UnknownOutcome,
    email_job_body,
)
from consumers.broker.topology import delete
from dedupe import DbConnection
from providers.fakes.smtp import FakeSmtp
from tests.apps.email_app import FAST_RETRY, SUPPRESSED_TABLE, smtp_settings, suppress
from tests.conftest import AMQP_URL, Spawn
from tests.harness import Harness
from tests.support import WorkerProcess, settle, wait_consumers, wait_for


@pytest.fixture
async def suppressed(db: DbConnection) -> DbConnection:
    await db.execute(SUPPRESSED_TABLE)
    return db


def email_app(
    queue: str,
    fake: FakeSmtp,
    *,
    timeout: float = 5.0,
    unknown_outcome: UnknownOutcome = UnknownOutcome.RESEND,
    app: App | None = None,
) -> App:
    app = app or App(retry=FAST_RETRY)
    app.email_handler(
        queue,
        settings=smtp_settings(fake.port, timeout=timeout),
        on_dead_address=suppress,
        unknown_outcome=unknown_outcome,
        lease_seconds=max(2.0, timeout * 2),
        probe_seconds=0.5,
    )
    return app


def job(*to: str) -> dict[str, object]:
    return email_job_body(
        to=list(to), subject="Your order shipped", text="On its way", html="<p>On its way</p>"
    )


async def ledger(db: DbConnection) -> list[tuple[str, str, int]]:
    rows = await db.fetch(
        "SELECT address, status, sends FROM send_ledger ORDER BY message_id, target_index"
    )
    return [(r["address"], r["status"], r["sends"]) for r in rows]


async def all_settled(db: DbConnection, n: int) -> bool:
    done = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status IN ('sent', 'failed')")
    return bool(done >= n)


async def test_each_recipient_gets_one_message_and_a_redelivery_sends_none(
    harness: Harness, suppressed: DbConnection, fake_smtp: FakeSmtp
) -> None:
    body = job("ada@example.com", "bob@Example.COM", "ada@EXAMPLE.com")  # ada twice: one e-mail
    async with harness.run(email_app(harness.queue, fake_smtp)):
        await harness.publish(body, message_id="order-1042-shipped", tenant="acme")
        await harness.publish(body, message_id="order-1042-shipped", tenant="acme")
        await wait_for(lambda: all_settled(suppressed, 2))
        await harness.publish(body, message_id="order-1042-shipped", tenant="acme")
        await harness.wait_outcome("duplicate_ignored", 2)
    assert await ledger(suppressed) == [
        ("ada@example.com", "sent", 1),
        ("bob@example.com", "sent", 1),
    ]
    rows = await suppressed.fetch(
        "SELECT channel, address, effect_id::text, provider_message_id FROM send_ledger"
    )
    by_id = fake_smtp.arrived_by_id()
    assert sorted(by_id.values()) == [1, 1]
    for row in rows:
        assert row["channel"] == "email"
        assert row["provider_message_id"] == f"<{row['effect_id']}@example.com>"
        assert by_id[row["provider_message_id"]] == 1
        (message,) = fake_smtp.messages_to(row["address"])
        assert message.rcpt_tos == (row["address"],)  # one recipient per message
    assert harness.outcomes()["email_sent"] == 2


async def test_a_dead_address_runs_the_hook_once_and_is_not_retried(
    harness: Harness, suppressed: DbConnection, fake_smtp: FakeSmtp
) -> None:
    fake_smtp.script("gone@example.com", rcpt="550 5.1.1 No such user")
    async with harness.run(email_app(harness.queue, fake_smtp)):
        await harness.publish(job("gone@example.com", "ada@example.com"), message_id="m-1")
        await wait_for(lambda: all_settled(suppressed, 2))
    assert await ledger(suppressed) == [
        ("gone@example.com", "failed", 1),
        ("ada@example.com", "sent", 1),
    ]
    hooks = await suppressed.fetch("SELECT address, reason FROM suppressed")
    assert [tuple(r) for r in hooks] == [("gone@example.com", "RecipientRefused 550 5.1.1")]
    assert fake_smtp.rcpts["gone@example.com"] == 1
    assert await harness.dead_letters() == []


async def test_a_greylisted_recipient_is_retried_with_backoff_and_arrives_once(
    harness: Harness, suppressed: DbConnection, fake_smtp: FakeSmtp
) -> None:
    fake_smtp.script("ada@example.com", rcpt="451 4.7.1 Greylisted", times=2)
    async with harness.run(email_app(harness.queue, fake_smtp)):
        await harness.publish(job("ada@example.com"), message_id="m-1")
        await wait_for(lambda: all_settled(suppressed, 1), timeout=20)
    assert await ledger(suppressed) == [("ada@example.com", "sent", 3)]
    assert fake_smtp.rcpts["ada@example.com"] == 3
    assert len(fake_smtp.messages) == 1


@pytest.mark.parametrize("policy", [UnknownOutcome.RESEND, UnknownOutcome.SKIP])
async def test_silence_after_the_final_dot_follows_the_policy_with_the_same_message_id(
    harness: Harness,
    suppressed: DbConnection,
    fake_smtp: FakeSmtp,
    policy: UnknownOutcome,
) -> None:
    fake_smtp.script("ada@example.com", silent=True, times=1)
    app = email_app(harness.queue, fake_smtp, timeout=1.0, unknown_outcome=policy)
    async with harness.run(app):
        await harness.publish(job("ada@example.com"), message_id="m-1")
        await wait_for(lambda: all_settled(suppressed, 1), timeout=20)
    ids = fake_smtp.arrived_by_id()
    if policy is UnknownOutcome.RESEND:  # a receiver that dedupes by Message-ID keeps one
        assert list(ids.values()) == [2]
        assert await ledger(suppressed) == [("ada@example.com", "sent", 2)]
    else:
        assert list(ids.values()) == [1]
        assert await ledger(suppressed) == [("ada@example.com", "failed", 1)]


async def test_a_refused_login_pauses_the_channel_and_sends_once_it_is_accepted(
    harness: Harness, suppressed: DbConnection
) -> None:
    async with FakeSmtp(username="shop", password="secret") as fake:
        fake.refuse_logins = True
        app = App(retry=FAST_RETRY)
        settings = replace(smtp_settings(fake.port), username="shop", password="secret")
        app.email_handler(harness.queue, settings=settings, probe_seconds=0.3)
        async with harness.run(app):
            await harness.publish(job("ada@example.com"), message_id="m-1")
            await harness.wait_outcome("email_deferred")
            fake.refuse_logins = False
            await wait_for(lambda: all_settled(suppressed, 1), timeout=20)
        assert len(fake.messages) == 1
    deferred = [e for e in harness.logs if e["event"] == "email_deferred"]
    assert "535" in str(deferred[0]["reason"])
    assert "secret" not in str(harness.logs)


async def test_an_invalid_email_job_is_dead_lettered_with_its_reason(
    harness: Harness, suppressed: DbConnection, fake_smtp: FakeSmtp
) -> None:
    injected = {"to": ["ada@example.com\r\nBcc: eve@example.com"], "subject": "s", "text": "t"}
    async with harness.run(email_app(harness.queue, fake_smtp)):
        await harness.publish(injected, message_id="injected")
        await harness.wait_dead_letters(1)
    (dead,) = await harness.dead_letters()
    assert dead.headers[REASON_HEADER] == "invalid_email_job"
    assert "to[0]" in str(dead.headers["x-error"])
    assert fake_smtp.rcpts == Counter()


# --- from a handler: the outbox --------------------------------------------


@pytest.fixture
async def mail_queue(queue_name: str, channel: aio_pika.abc.AbstractChannel) -> AsyncIterator[str]:
    name = f"{queue_name}.mail"
    yield name
    await delete(channel, name, FAST_RETRY)


async def test_a_handler_emits_one_email_iff_its_effects_committed(
    harness: Harness, suppressed: DbConnection, fake_smtp: FakeSmtp, mail_queue: str
) -> None:
    app = App(retry=FAST_RETRY)

    @app.handler(harness.queue)
    async def ship(ctx: Context) -> None:
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ($1, $2, $3, '', 0)",
            ctx.consumer,
            ctx.tenant,
            ctx.message_id,
        )
        mail = email_job_body(to=[ctx.body["email"]], subject="Shipped", text="On its way")
        await ctx.emit(mail_queue, mail, message_id=f"{ctx.message_id}:mail")
        if ctx.body.get("fail"):
            raise Reject(reason="no_good")

    email_app(mail_queue, fake_smtp, app=app)
    relay = Relay(replace(harness.settings, relay=RelaySettings(poll_interval_s=0.2)))
    async with harness.run(app):
        await relay.start()
        try:
            await harness.publish({"email": "ada@example.com"}, message_id="order-1")
            await harness.publish({"email": "eve@example.com", "fail": True}, message_id="order-2")
            await harness.publish({"email": "ada@example.com"}, message_id="order-1")  # again
            await wait_for(lambda: all_settled(suppressed, 1), timeout=30)
            await harness.wait_dead_letters(1)
            await harness.wait_outcome("duplicate_ignored")
            await settle(lambda: _arrived(fake_smtp), quiet=0.5, timeout=30)
        finally:
            await relay.stop()
    assert await suppressed.fetchval("SELECT count(*) FROM effects") == 1
    assert [m.rcpt_tos for m in fake_smtp.messages] == [("ada@example.com",)]
    assert fake_smtp.rcpts["eve@example.com"] == 0


async def _arrived(fake: FakeSmtp) -> int:
    return len(fake.messages)


# --- a real worker process, SIGKILLed --------------------------------------


@pytest.fixture
def spawn_email(worker_env: dict[str, str], fake_smtp: FakeSmtp, tmp_path: Path) -> Iterator[Spawn]:
    started: list[WorkerProcess] = []

    def start(extra: dict[str, str] | None = None) -> WorkerProcess:
        env = {**worker_env, "TEST_SMTP_PORT": str(fake_smtp.port), **(extra or {})}
        worker = WorkerProcess(
            "tests.apps.email_app:app", env, tmp_path / f"email-{len(started)}.log"
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop_now()


async def test_worker_killed_after_the_final_dot_resends_only_what_was_on_the_wire(
    suppressed: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn_email: Spawn,
    fake_smtp: FakeSmtp,
) -> None:
    """The server holds its reply to three messages (their final `.` read: they have
    arrived) while the others are answered; the worker is SIGKILLed. Another worker
    takes the three over once their lease lapsed and sends them again, with the same
    Message-ID: those arrive twice, every other message once."""
    recipients = [f"r{n:02d}@example.com" for n in range(20)]
    held = recipients[:3]
    reply = asyncio.Event()
    for address in held:
        fake_smtp.script(address, until=reply, times=1)
    # The held replies must still be awaited at the kill: a timeout well above the
    # time the others take; the lease the least that covers it (70% of 8 s > 5 s).
    short = {"TEST_LEASE_SECONDS": "8", "TEST_SMTP_TIMEOUT": "5"}
    first = spawn_email(short)
    await wait_consumers(AMQP_URL, queue_name, 1)
    await publisher.publish(queue_name, job(*recipients), message_id="blast-1")

    async def others_recorded() -> bool:
        sent = await suppressed.fetchval("SELECT count(*) FROM send_ledger WHERE status = 'sent'")
        return sent == len(recipients) - len(held) and len(fake_smtp.messages) == len(recipients)

    await wait_for(others_recorded, timeout=30)  # the held three are `sending`, replies held
    first.kill()
    assert await first.wait() == -signal.SIGKILL
    assert '"email_deferred"' not in first.log_text()  # the held sends were still waiting
    reply.set()  # to a dead socket
    arrived_at_kill = {m.message_id for m in fake_smtp.messages}
    recorded = {
        r["provider_message_id"]
        for r in await suppressed.fetch(
            "SELECT provider_message_id FROM send_ledger WHERE status = 'sent'"
        )
    }
    on_the_wire = arrived_at_kill - recorded

    second = spawn_email(short)
    await wait_for(lambda: all_settled(suppressed, len(recipients)), timeout=30)
    second.terminate()
    await second.expect_exit(0)
    arrivals = fake_smtp.arrived_by_id()
    twice = {message_id for message_id, n in arrivals.items() if n > 1}
    assert len(arrivals) == len(recipients)  # nothing lost
    assert max(arrivals.values()) <= 2
    assert twice <= on_the_wire, "a message arrived twice that was not on the wire at the kill"
    assert {m.message_id for m in fake_smtp.messages if m.rcpt_tos[0] in held} == on_the_wire
    assert twice == on_the_wire  # RESEND: the three went again, with their Message-IDs
    assert {s for _, s, _ in await ledger(suppressed)} == {"sent"}
    print(
        f"email sigkill: recipients={len(recipients)} on_the_wire_at_kill={len(on_the_wire)}"
        f" arrived_twice={len(twice)} arrived_once={len(arrivals) - len(twice)}"
    )
