"""An e-mail's value and its MIME message: what it refuses, and what the stdlib builds."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage

import pytest

from providers import Email, InvalidEmail, SmtpSettings, SmtpTls
from providers.mail import address_problem, header_problem, mailbox_problem


def _parsed(value: Email) -> EmailMessage:
    raw = value.message(message_id="<id-1@example.com>", default_sender="shop@example.com")
    parsed = email.message_from_bytes(raw.as_bytes(), policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


@pytest.mark.parametrize(
    "address",
    ["ada@example.com", "A.B+tag@Example.COM", '"quoted name"@example.com', "x@[192.0.2.1]"],
)
def test_an_addr_spec_is_an_address(address: str) -> None:
    assert address_problem(address) is None


@pytest.mark.parametrize(
    "address",
    [
        "",
        "ada",
        "ada@",
        "@example.com",
        "a b@example.com",
        "a@b@example.com",
        "Ada <ada@example.com>",
        "ada@example.com (comment)",
        "ada@example.com, bob@example.com",
        "ada@example.com\r\nBcc: eve@example.com",
        "ada@example.com\n",
        "ada\x00@example.com",
        "ü@example.com",
        "a" * 65 + "@example.com",
        "a@" + "b" * 260 + ".com",
    ],
)
def test_anything_but_one_addr_spec_is_refused(address: str) -> None:
    assert address_problem(address) is not None


def test_a_mailbox_may_have_a_display_name_but_not_two_addresses() -> None:
    assert mailbox_problem("Shop <shop@example.com>") is None
    assert mailbox_problem("shop@example.com") is None
    assert mailbox_problem("Shop <shop@>") is not None
    assert mailbox_problem("a@example.com, b@example.com") is not None
    assert mailbox_problem("Shop <shop@example.com>\r\nBcc: eve@example.com") is not None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Order\r\nBcc", "1"),
        ("X-Order", "1\r\nBcc: eve@example.com"),
        ("X-Order", "1\nBcc: eve@example.com"),
        ("X Order", "1"),
        ("X-Order:", "1"),
        ("Bcc", "eve@example.com"),
        ("Message-ID", "<mine@example.com>"),
        ("content-type", "text/plain"),
    ],
)
def test_an_extra_header_cannot_inject_or_replace_one(name: str, value: str) -> None:
    assert header_problem(name, value) is not None
    with pytest.raises(InvalidEmail):
        Email(to="ada@example.com", subject="s", text="t", headers={name: value})


def test_text_and_html_are_multipart_alternative_with_our_message_id() -> None:
    message = _parsed(
        Email(
            to="ada@example.com",
            subject="Your order — shipped",
            text="It is on its way: ünïcode",
            html="<p>It is on its way</p>",
            reply_to="Help <help@example.com>",
            headers={"X-Order": "1042"},
        )
    )
    assert message.get_content_type() == "multipart/alternative"
    assert message["Message-ID"] == "<id-1@example.com>"
    assert message["From"] == "shop@example.com"
    assert message["To"] == "ada@example.com"
    assert message["Subject"] == "Your order — shipped"
    assert message["Reply-To"] == "Help <help@example.com>"
    assert message["X-Order"] == "1042"
    plain = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert plain is not None and plain.get_content().strip() == "It is on its way: ünïcode"
    assert html is not None and "<p>It is on its way</p>" in html.get_content()


def test_the_message_is_seven_bit_so_a_server_without_8bitmime_takes_it() -> None:
    raw = Email(to="ada@example.com", subject="ünï", text="ünïcode " * 50).message(
        message_id="<id-1@example.com>", default_sender="Shöp <shop@example.com>"
    )
    assert raw.as_bytes().isascii()


def test_html_alone_is_text_html_and_the_job_from_wins_over_the_default() -> None:
    message = _parsed(
        Email(to="ada@example.com", subject="s", html="<b>hi</b>", sender="Bob <bob@example.com>")
    )
    assert message.get_content_type() == "text/html"
    assert message["From"] == "Bob <bob@example.com>"


def test_an_email_needs_text_or_html_and_a_subject_on_one_line() -> None:
    with pytest.raises(InvalidEmail, match="text or html"):
        Email(to="ada@example.com", subject="s")
    with pytest.raises(InvalidEmail, match="subject"):
        Email(to="ada@example.com", subject="s\r\nBcc: eve@example.com", text="t")
    with pytest.raises(InvalidEmail, match="to"):
        Email(to="ada@example.com, eve@example.com", subject="s", text="t")


def test_plain_text_smtp_only_to_an_allow_listed_host() -> None:
    SmtpSettings(host="127.0.0.1", tls=SmtpTls.NONE, default_from="shop@example.com")
    with pytest.raises(ValueError, match="plaintext_hosts"):
        SmtpSettings(host="smtp.example.com", tls=SmtpTls.NONE, default_from="shop@example.com")
    relay = SmtpSettings(
        host="relay",
        tls=SmtpTls.NONE,
        default_from="shop@example.com",
        plaintext_hosts=frozenset({"relay"}),
    )
    assert relay.server_port == 25


def test_the_message_id_is_the_effect_id_at_the_senders_domain_on_every_call() -> None:
    settings = SmtpSettings(host="smtp.example.com", default_from="Shop <shop@Mail.Example.com>")
    assert settings.message_id("1234") == "<1234@mail.example.com>"
    assert settings.message_id("1234") == settings.message_id("1234")
    assert (
        SmtpSettings(
            host="smtp.example.com",
            default_from="shop@example.com",
            message_id_domain="ids.example.org",
        ).message_id("1")
        == "<1@ids.example.org>"
    )
    assert settings.server_port == 587
    assert "secret" not in repr(
        SmtpSettings(host="h", default_from="a@b.c", username="u", password="secret")
    )
