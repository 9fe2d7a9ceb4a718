"""SmtpSender through aiosmtplib against a real SMTP server (aiosmtpd): the taxonomy.

Each test names an answer of the server and what the sender makes of it; the
fake counts what arrived by Message-ID, and the RCPT commands per recipient
(the attempts that reached it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from providers import (
    Email,
    NotStartedInTime,
    PermanentProviderError,
    ProviderConfigurationError,
    SendIds,
    SmtpSender,
    SmtpTls,
    TargetGone,
    TransientProviderError,
    UnknownOutcomeError,
    send_ids,
)
from providers.fakes.smtp import FakeSmtp

TIMEOUT_S = 1.0


@pytest.fixture
async def sender(fake_smtp: FakeSmtp) -> AsyncIterator[SmtpSender]:
    smtp = SmtpSender(fake_smtp.settings(timeout_seconds=TIMEOUT_S))
    yield smtp
    await smtp.aclose()


def _email(to: str) -> tuple[Email, SendIds]:
    return Email(to=to, subject="Shipped", text="On its way"), send_ids("order-1042", to)


async def test_a_send_is_one_message_whose_id_is_the_effects_at_the_senders_domain(
    sender: SmtpSender, fake_smtp: FakeSmtp
) -> None:
    email, ids = _email("ada@example.com")
    receipt = await sender.send(email, ids)
    assert receipt.provider == "smtp"
    assert receipt.provider_message_id == f"<{ids.effect_id}@example.com>"
    (message,) = fake_smtp.messages
    assert message.message_id == receipt.provider_message_id
    assert message.rcpt_tos == ("ada@example.com",)
    assert message.mail_from == "shop@example.com"
    assert message.message["From"] == "Shop <shop@example.com>"
    assert fake_smtp.rcpts["ada@example.com"] == 1


async def test_the_same_ids_twice_are_two_messages_with_one_message_id(
    sender: SmtpSender, fake_smtp: FakeSmtp
) -> None:
    email, ids = _email("ada@example.com")
    first = await sender.send(email, ids)
    second = await sender.send(email, ids)
    assert first == second
    assert fake_smtp.arrived_by_id() == {first.provider_message_id: 2}


@pytest.mark.parametrize(
    ("reply", "error", "reason"),
    [
        ("451 4.7.1 Greylisted, try again", TransientProviderError, "RecipientRefused 451 4.7.1"),
        ("452 4.2.2 Mailbox full", TransientProviderError, "RecipientRefused 452 4.2.2"),
        ("550 5.1.1 No such user", TargetGone, "RecipientRefused 550 5.1.1"),
        ("550 No such user here", TargetGone, "RecipientRefused 550"),
        ("553 5.1.3 Bad address syntax", TargetGone, "RecipientRefused 553 5.1.3"),
        ("550 5.7.1 Blocked by policy", PermanentProviderError, "RecipientRefused 550 5.7.1"),
        ("552 5.2.2 Over quota", PermanentProviderError, "RecipientRefused 552 5.2.2"),
    ],
)
async def test_a_refused_recipient_is_retried_gone_or_failed_by_its_codes(
    sender: SmtpSender,
    fake_smtp: FakeSmtp,
    reply: str,
    error: type[Exception],
    reason: str,
) -> None:
    fake_smtp.script("ada@example.com", rcpt=reply)
    email, ids = _email("ada@example.com")
    with pytest.raises(error) as raised:
        await sender.send(email, ids)
    assert type(raised.value) is error
    assert str(getattr(raised.value, "reason", "")) == reason
    assert "ada" not in str(
        raised.value
    )  # the reply's text, which repeats the address, is not kept
    assert fake_smtp.messages == []
    assert fake_smtp.rcpts["ada@example.com"] == 1


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("451 4.3.0 Local error, try later", TransientProviderError),
        ("552 5.3.4 Message too big", PermanentProviderError),
        ("554 5.7.1 Rejected as spam", PermanentProviderError),
    ],
)
async def test_a_refused_message_after_its_final_dot_is_retried_or_failed_and_has_not_arrived(
    sender: SmtpSender, fake_smtp: FakeSmtp, reply: str, error: type[Exception]
) -> None:
    fake_smtp.script("ada@example.com", data=reply)
    email, ids = _email("ada@example.com")
    with pytest.raises(error) as raised:
        await sender.send(email, ids)
    assert type(raised.value) is error
    assert fake_smtp.messages == []


async def test_silence_after_the_final_dot_is_an_unknown_outcome_and_the_message_arrived(
    sender: SmtpSender, fake_smtp: FakeSmtp
) -> None:
    fake_smtp.script("ada@example.com", silent=True, times=1)
    email, ids = _email("ada@example.com")
    started = time.monotonic()
    with pytest.raises(UnknownOutcomeError, match="after the message"):
        await sender.send(email, ids)
    assert time.monotonic() - started < TIMEOUT_S * 3
    assert fake_smtp.arrivals(f"<{ids.effect_id}@example.com>") == 1  # the server has it


async def test_a_server_that_never_greets_is_transient_nothing_was_sent(
    fake_smtp: FakeSmtp,
) -> None:
    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads, never answers
        writer.close()

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    smtp = SmtpSender(fake_smtp.settings(port=port, timeout_seconds=TIMEOUT_S))
    try:
        with pytest.raises(TransientProviderError) as raised:
            await smtp.send(*_email("ada@example.com"))
        assert not isinstance(raised.value, ProviderConfigurationError)
    finally:
        await smtp.aclose()
        server.close()
        await server.wait_closed()


async def test_a_refused_connection_is_transient(fake_smtp: FakeSmtp) -> None:
    closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    smtp = SmtpSender(fake_smtp.settings(port=port, timeout_seconds=TIMEOUT_S))
    with pytest.raises(TransientProviderError, match="ConnectFailed"):
        await smtp.send(*_email("ada@example.com"))
    await smtp.aclose()


async def test_a_login_refused_535_is_a_configuration_error_that_pauses_the_channel() -> None:
    async with FakeSmtp(username="shop", password="right") as fake:
        wrong = SmtpSender(fake.settings(password="wrong", timeout_seconds=TIMEOUT_S))
        with pytest.raises(ProviderConfigurationError, match="535"):
            await wrong.send(*_email("ada@example.com"))
        right = SmtpSender(fake.settings(timeout_seconds=TIMEOUT_S))
        await right.send(*_email("ada@example.com"))
        await wrong.aclose()
        await right.aclose()
        assert len(fake.messages) == 1


@pytest.mark.parametrize("tls", [SmtpTls.STARTTLS, SmtpTls.IMPLICIT])
async def test_tls_with_login_sends(tls: SmtpTls) -> None:
    async with FakeSmtp(tls=tls, username="shop", password="secret") as fake:
        smtp = SmtpSender(fake.settings(timeout_seconds=TIMEOUT_S * 3))
        await smtp.send(*_email("ada@example.com"))
        await smtp.aclose()
        assert len(fake.messages) == 1


async def test_starttls_required_and_not_offered_is_a_configuration_error(
    fake_smtp: FakeSmtp,
) -> None:
    smtp = SmtpSender(fake_smtp.settings(tls=SmtpTls.STARTTLS, timeout_seconds=TIMEOUT_S))
    with pytest.raises(ProviderConfigurationError, match="STARTTLS"):
        await smtp.send(*_email("ada@example.com"))
    await smtp.aclose()
    assert fake_smtp.messages == []


@pytest.mark.parametrize("tls", [SmtpTls.STARTTLS, SmtpTls.IMPLICIT])
async def test_a_certificate_not_trusted_is_a_configuration_error(tls: SmtpTls) -> None:
    async with FakeSmtp(tls=tls) as fake:
        smtp = SmtpSender(fake.settings(ca_file=None, timeout_seconds=TIMEOUT_S))
        with pytest.raises(ProviderConfigurationError, match="TlsFailed"):
            await smtp.send(*_email("ada@example.com"))
        await smtp.aclose()
        assert fake.messages == []


async def test_one_session_carries_message_after_message_and_survives_a_refusal(
    sender: SmtpSender, fake_smtp: FakeSmtp
) -> None:
    fake_smtp.script("gone@example.com", rcpt="550 5.1.1 No such user")
    for n in range(5):
        await sender.send(*_email(f"r{n}@example.com"))
    with pytest.raises(TargetGone):
        await sender.send(*_email("gone@example.com"))
    await sender.send(*_email("r5@example.com"))
    assert len(fake_smtp.messages) == 6
    assert fake_smtp.connections == 1
    assert sender.connections_opened == 1


async def test_a_pooled_session_the_server_closed_is_replaced_and_the_message_sent_once(
    sender: SmtpSender, fake_smtp: FakeSmtp
) -> None:
    await sender.send(*_email("ada@example.com"))
    for smtp in list(fake_smtp._protocols):  # the server ends the idle session
        assert smtp.transport is not None
        smtp.transport.close()
    email, ids = _email("bob@example.com")
    await sender.send(email, ids)
    assert fake_smtp.arrivals(f"<{ids.effect_id}@example.com>") == 1
    assert fake_smtp.connections == 2


async def test_no_send_starts_that_could_not_be_answered_before_its_deadline(
    sender: SmtpSender, fake_smtp: FakeSmtp
) -> None:
    with pytest.raises(NotStartedInTime):
        await sender.send(*_email("ada@example.com"), deadline=time.monotonic() + TIMEOUT_S / 2)
    assert fake_smtp.connections == 0
    assert fake_smtp.messages == []


async def test_a_session_idle_longer_than_idle_seconds_is_not_reused(fake_smtp: FakeSmtp) -> None:
    smtp = SmtpSender(fake_smtp.settings(timeout_seconds=TIMEOUT_S, idle_seconds=1e-9))
    await smtp.send(*_email("ada@example.com"))
    await smtp.send(*_email("bob@example.com"))
    await smtp.aclose()
    assert (fake_smtp.connections, len(fake_smtp.messages)) == (2, 2)
