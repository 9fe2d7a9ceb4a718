"""A local SMTP server on aiosmtpd: it records every message and answers as scripted.

```python
async with FakeSmtp() as smtp:
    smtp.script("gone@example.com", rcpt="550 5.1.1 No such user")
    sender = SmtpSender(smtp.settings())
    ...
    assert smtp.arrivals(message_id) == 1
```

It runs aiosmtpd's SMTP protocol in the caller's event loop, on 127.0.0.1: plain
text by default, or STARTTLS / implicit TLS with a throwaway CA (`tls=`), and AUTH
when given a username and password (a wrong login, or `refuse_logins`, is 535).

A message has *arrived* once the server read its final `.` and no script refused
it: `messages` lists them, `arrivals(message_id)` counts them by Message-ID (a
receiver that dedupes by Message-ID keeps one). A message held by a script
(`until=`) or never answered (`silent=True`) has arrived: the server has it, and
only the reply is missing, the unknown-outcome case. `rcpts` counts the RCPT
commands per recipient: the attempts that reached the server.

aiosmtpd comes with the project's dev group, not with the `mail` extra.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import tempfile
import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Self

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from providers.smtp_settings import SmtpSettings, SmtpTls

ACCEPTED = "250 2.0.0 Ok: queued"


@dataclass(frozen=True, slots=True, kw_only=True)
class SmtpScript:
    """How the fake answers one attempt to a recipient.

    `rcpt`: the reply to RCPT TO (a 4xx or 5xx refuses there); `data`: the reply to
    the message's final `.` (a 4xx or 5xx refuses it; it has not arrived then);
    `until`: hold that reply until the event is set; `silent`: never reply to it."""

    rcpt: str | None = None
    data: str | None = None
    until: asyncio.Event | None = None
    silent: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SmtpMessage:
    """One message the fake read in full and did not refuse."""

    message_id: str
    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: EmailMessage  # parsed with the stdlib's `email.policy.default`
    raw: bytes
    received_at: float  # time.monotonic()


@dataclass(slots=True)
class _Queued:
    script: SmtpScript
    remaining: int | None


class FakeSmtp:
    """A fake SMTP server (see the module docstring); use it as `async with`."""

    def __init__(
        self,
        *,
        tls: SmtpTls = SmtpTls.NONE,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.tls = tls
        self.username = username
        self.password = password
        self.refuse_logins = False  # answer every AUTH with 535
        self.messages: list[SmtpMessage] = []
        self.rcpts: Counter[str] = Counter()  # RCPT TO commands, per recipient
        self.connections = 0  # SMTP sessions opened
        self._scripts: dict[str, deque[_Queued]] = {}
        self._chosen: dict[int, SmtpScript] = {}  # per session: its transaction's script
        self._closing = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._protocols: weakref.WeakSet[SMTP] = weakref.WeakSet()
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        self._ca_file: Path | None = None

    async def __aenter__(self) -> Self:
        context = None
        if self.tls is not SmtpTls.NONE:
            from providers.fakes.tls import make_local_certificates

            self._directory = tempfile.TemporaryDirectory(prefix="fake-smtp-")
            certificates = make_local_certificates(Path(self._directory.name))
            self._ca_file = certificates.ca_file
            context = certificates.server_context(alpn=())
        loop = asyncio.get_running_loop()
        starttls = context if self.tls is SmtpTls.STARTTLS else None
        implicit = context if self.tls is SmtpTls.IMPLICIT else None

        def protocol() -> SMTP:
            self.connections += 1
            smtp = SMTP(
                _Handler(self),
                hostname="fake-smtp.local",
                tls_context=starttls,
                require_starttls=starttls is not None,
                # STARTTLS: no AUTH before it; implicit TLS is TLS from the first byte
                # (aiosmtpd only knows of its own STARTTLS).
                auth_require_tls=self.tls is SmtpTls.STARTTLS,
                authenticator=self._authenticate if self.username is not None else None,
                loop=loop,
            )
            self._protocols.add(smtp)
            return smtp

        self._server = await loop.create_server(protocol, "127.0.0.1", 0, ssl=implicit)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing.set()  # every held reply ends
        if self._server is not None:
            self._server.close()
        for smtp in list(self._protocols):
            if smtp.transport is not None:
                smtp.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
        if self._directory is not None:
            self._directory.cleanup()

    @property
    def port(self) -> int:
        assert self._server is not None, "use FakeSmtp as an async context manager"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def settings(self, **overrides: Any) -> SmtpSettings:
        """`SmtpSettings` that reach this fake (its TLS, its CA, its login)."""
        values: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "tls": self.tls,
            "ca_file": self._ca_file,
            "username": self.username,
            "password": self.password,
            "default_from": "Shop <shop@example.com>",
        }
        return SmtpSettings(**(values | overrides))

    def script(
        self,
        recipient: str,
        *,
        rcpt: str | None = None,
        data: str | None = None,
        until: asyncio.Event | None = None,
        silent: bool = False,
        times: int | None = None,
    ) -> None:
        """Answer `recipient`'s next `times` attempts (all, if None) this way; scripts queue."""
        script = SmtpScript(rcpt=rcpt, data=data, until=until, silent=silent)
        queued = _Queued(script=script, remaining=times)
        self._scripts.setdefault(recipient.lower(), deque()).append(queued)

    def arrivals(self, message_id: str) -> int:
        """How many times the message with this Message-ID arrived."""
        return sum(m.message_id == message_id for m in self.messages)

    def arrived_by_id(self) -> Counter[str]:
        """Arrivals per Message-ID."""
        return Counter(m.message_id for m in self.messages)

    def messages_to(self, address: str) -> list[SmtpMessage]:
        return [m for m in self.messages if address.lower() in (r.lower() for r in m.rcpt_tos)]

    def _next_script(self, recipient: str) -> SmtpScript:
        scripts = self._scripts.get(recipient.lower())
        while scripts:
            queued = scripts[0]
            if queued.remaining is None:
                return queued.script
            if queued.remaining > 0:
                queued.remaining -= 1
                return queued.script
            scripts.popleft()
        return SmtpScript()

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = isinstance(data, LoginPassword) and not self.refuse_logins
        ok = ok and (data.login.decode(), data.password.decode()) == (self.username, self.password)
        if ok:
            return AuthResult(success=True)
        # handled=False: aiosmtpd then answers 535 (its default would send no reply at all)
        return AuthResult(success=False, handled=False)


class _Handler:
    """aiosmtpd's hooks: scripts chosen at RCPT, the message recorded at its final `.`."""

    def __init__(self, fake: FakeSmtp) -> None:
        self.fake = fake

    async def handle_MAIL(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        mail_options: list[str],
    ) -> str:
        if self.fake.username is not None and not session.authenticated:
            return "530 5.7.0 Authentication required"
        self.fake._chosen.pop(id(session), None)
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        self.fake.rcpts[address.lower()] += 1
        script = self.fake._next_script(address)
        if script.rcpt is not None:
            return script.rcpt
        self.fake._chosen[id(session)] = script
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        script = self.fake._chosen.pop(id(session), SmtpScript())
        if script.data is not None and not script.data.startswith("2"):
            return script.data  # refused: it has not arrived
        raw = envelope.original_content or b""
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.fake.messages.append(
            SmtpMessage(
                message_id=str(parsed.get("Message-ID", "")),
                mail_from=str(envelope.mail_from),
                rcpt_tos=tuple(envelope.rcpt_tos),
                message=parsed,
                raw=raw,
                received_at=time.monotonic(),
            )
        )
        if script.silent or script.until is not None:
            waits = [asyncio.ensure_future(self.fake._closing.wait())]
            if script.until is not None and not script.silent:
                waits.append(asyncio.ensure_future(script.until.wait()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        return script.data or f"{ACCEPTED} as {len(self.fake.messages)}"
