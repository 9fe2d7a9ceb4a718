"""How to reach an SMTP server: `SmtpSettings`, readable without the `mail` extra.

TLS is required unless the server is this machine: implicit TLS (port 465, TLS
from the first byte) or STARTTLS (port 587, refused before MAIL if the server does
not offer it); plain text only to a host in `plaintext_hosts` (loopback by
default: a local relay or a test server), never silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from providers.mail import address_problem, envelope_sender, mailbox_problem

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
DEFAULT_PORTS = {"implicit": 465, "starttls": 587, "none": 25}


class SmtpTls(StrEnum):
    IMPLICIT = "implicit"  # TLS from the first byte (SMTPS, port 465)
    STARTTLS = "starttls"  # STARTTLS required before anything is sent (port 587)
    NONE = "none"  # plain text: only to a host in `plaintext_hosts`


@dataclass(frozen=True, slots=True, kw_only=True)
class SmtpSettings:
    """The server, its TLS and login, the sender's limits and its message defaults.

    `timeout_seconds` bounds one whole send (connecting included, when no pooled
    connection is free) up to the reply to the message's final `.`: it is the
    sender's `answer_seconds`. `connect_timeout_seconds` bounds a new connection's
    set-up (TCP, greeting, STARTTLS, AUTH), within what the send has left.

    `max_in_flight`: the connections kept, one message on each at a time; a
    connection is reused for the next message (one SMTP session per message would
    cost a TCP and TLS handshake, EHLO and AUTH each time), unless idle longer than
    `idle_seconds` (servers close idle sessions: RFC 5321 lets them after 5 minutes).

    `default_from`: the From of a message that names none; `message_id_domain`:
    the right side of every Message-ID (default: `default_from`'s domain).
    `ca_file`: a CA to trust instead of the system's (a private relay, a test server).
    """

    host: str
    default_from: str
    port: int | None = None  # None: 465, 587 or 25 by `tls`
    tls: SmtpTls = SmtpTls.STARTTLS
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    message_id_domain: str | None = None
    timeout_seconds: float = 20.0
    connect_timeout_seconds: float = 5.0
    max_in_flight: int = 4
    idle_seconds: float = 60.0
    ca_file: Path | str | None = None
    plaintext_hosts: frozenset[str] = LOOPBACK

    def __post_init__(self) -> None:
        if self.tls is SmtpTls.NONE and self.host not in self.plaintext_hosts:
            raise ValueError(
                f"SMTP without TLS only to a host in plaintext_hosts (here {self.host!r} is"
                " not): use tls=implicit or starttls, or name the host there on purpose"
            )
        if (problem := mailbox_problem(self.default_from)) is not None:
            raise ValueError(f"default_from: {problem}")
        if self.message_id_domain is not None and address_problem(f"id@{self.message_id_domain}"):
            raise ValueError("message_id_domain: a domain such as mail.example.com")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password: both or neither")
        if not (self.timeout_seconds > 0 and self.connect_timeout_seconds > 0):
            raise ValueError("timeout_seconds and connect_timeout_seconds: positive")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight: at least 1")

    @property
    def server_port(self) -> int:
        return self.port if self.port is not None else DEFAULT_PORTS[str(self.tls)]

    @property
    def id_domain(self) -> str:
        """The right side of every Message-ID."""
        if self.message_id_domain is not None:
            return self.message_id_domain
        return envelope_sender(self.default_from).rpartition("@")[2].lower()

    def message_id(self, effect_id: str) -> str:
        """The Message-ID of the effect `effect_id`: the same on every attempt."""
        return f"<{effect_id}@{self.id_domain}>"
