"""E-mail over SMTP through aiosmtplib: one message to one recipient per attempt.

SMTP can be neither replayed by key nor asked about a message (`recovery` is
NEITHER): after a crash the queue's resend/skip policy decides, and the
Message-ID (`<{effect_id}@{domain}>`, the same on every attempt) is the only
backstop, for the receivers that dedupe by it.

What the server's answer means, by the stage it came at:

- 2xx to the message's final `.`: sent; the receipt's id is the Message-ID;
- 4xx at any stage (421, 450, 451, 452...): `TransientProviderError`, retried
  with backoff;
- at connect, our login or set-up refused (530, 534, 535; AUTH or STARTTLS not
  offered; the certificate refused; 5xx to the greeting or EHLO):
  `ProviderConfigurationError`, the channel pauses as for APNs' 403;
- 5xx to RCPT about the address (enhanced x.1.x or 5.2.1; 550, 551, 553 when
  the reply has no enhanced code): `TargetGone`, the app's hook may suppress it;
- any other 5xx (MAIL, RCPT, DATA, the message): `PermanentProviderError`;
- refused, timed out or lost up to the message's final `.`:
  `TransientProviderError`, nothing was accepted;
- timed out or lost after the final `.`, before its reply: `UnknownOutcomeError`,
  it may have been delivered.

The receipt names the Message-ID, not the server's queue id: the 250 reply has no
standard form for one (Postfix `queued as 4Bf...`, Exim `id=1r...`, SES its
own), while the Message-ID is ours, known before the answer, and what bounces
and the recipient's copy carry. Reasons carry the reply's code and enhanced
status code (`RecipientRefused 550 5.1.1`), not its text, which often repeats
the address.

Traps of the library, and what we do instead:

(a) `SMTP.data()` sends DATA and then the message under one timeout: a timeout
    waiting for the 354 (nothing sent) and one waiting for the reply to the
    final `.` (perhaps delivered) raise the same error. Here DATA is a command of
    its own, and only once the 354 came is the message written (with the
    library's own line-ending normalization and dot-stuffing) and its reply read:
    the stage of a failure is known.
(b) `send_message()` opens, uses and closes one session per message: a TCP and
    TLS handshake, EHLO and AUTH per e-mail. Here up to `max_in_flight`
    sessions are kept and reused; one the server closed while it waited is
    dropped before use, and one found closed by MAIL FROM (nothing was sent on
    it) is replaced once within the same attempt.
(c) `start_tls=None` (its default) upgrades only if the server offers STARTTLS,
    and sends in plain text otherwise. Here STARTTLS is `start_tls=True`
    (refused when not offered), implicit TLS `use_tls=True`, and plain text is
    allowed only to an allow-listed host (`SmtpSettings`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import aiosmtplib
from aiosmtplib.protocol import PERIOD_REGEX, normalize_message_line_endings

from providers.errors import (
    NotStartedInTime,
    PermanentProviderError,
    ProviderConfigurationError,
    ProviderError,
    TargetGone,
    TransientProviderError,
    UnknownOutcomeError,
)
from providers.ids import SendIds
from providers.mail import Email, envelope_sender
from providers.provider import NEITHER, ProviderReceipt
from providers.smtp_settings import SmtpSettings, SmtpTls

T = TypeVar("T")

_ENHANCED = re.compile(r"^([245])\.(\d{1,3})\.(\d{1,3})\b")
_CONFIGURATION_CODES = frozenset({530, 534, 535, 538})  # auth required / too weak / refused
_GONE_CODES = frozenset({550, 551, 553})  # mailbox unavailable, not local, name not allowed
_QUIT_SECONDS = 1.0


class Stage(StrEnum):
    CONNECT = "connect"  # TCP, TLS, greeting, EHLO, STARTTLS, AUTH
    MAIL = "mail"
    RCPT = "rcpt"
    DATA = "data"  # the DATA command, up to its 354
    MESSAGE = "message"  # the message and its final `.`, up to the reply


_REFUSED = {
    Stage.CONNECT: "ConnectRefused",
    Stage.MAIL: "SenderRefused",
    Stage.RCPT: "RecipientRefused",
    Stage.DATA: "DataRefused",
    Stage.MESSAGE: "MessageRefused",
}


@dataclass(slots=True)
class _Session:
    smtp: aiosmtplib.SMTP
    idle_since: float


class _Stale(Exception):
    """A pooled session was closed by the server before MAIL FROM: nothing was sent."""


class SmtpSender:
    """A `Sender[Email]` over SMTP (see the module docstring)."""

    name = "smtp"
    recovery = NEITHER  # the Message-ID is the backstop

    def __init__(self, settings: SmtpSettings) -> None:
        self.settings = settings
        self.answer_seconds = settings.timeout_seconds
        self._slots = asyncio.Semaphore(settings.max_in_flight)
        self._idle: list[_Session] = []
        self._busy: set[aiosmtplib.SMTP] = set()
        self._tls: ssl.SSLContext | None = None
        if settings.tls is not SmtpTls.NONE:
            ca = None if settings.ca_file is None else str(settings.ca_file)
            self._tls = ssl.create_default_context(cafile=ca)
        self._local_hostname: str | None = None
        self._closed = False
        self.connections_opened = 0  # sessions set up, for tests and benchmarks

    @property
    def max_in_flight(self) -> int:
        return self.settings.max_in_flight

    async def send(
        self, effect: Email, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        if self._closed:
            raise TransientProviderError("SenderClosed", provider=self.name)
        answer_by = float("inf") if deadline is None else deadline
        if time.monotonic() > answer_by - self.answer_seconds:
            raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)
        message_id = self.settings.message_id(ids.effect_id)
        message = effect.message(message_id=message_id, default_sender=self.settings.default_from)
        raw = normalize_message_line_endings(message.as_bytes())
        sender = envelope_sender(effect.sender or self.settings.default_from)
        async with self._slots:  # the runner hands no more than max_in_flight: no wait
            started = time.monotonic()
            if started > answer_by - self.answer_seconds:
                raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)
            ends = started + self.answer_seconds
            await self._deliver(sender, effect.to, raw, ends)
        return ProviderReceipt(provider=self.name, provider_message_id=message_id)

    async def aclose(self) -> None:
        """Take no more sends; QUIT the idle sessions (a send in flight closes its own)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for session in idle:
            with contextlib.suppress(Exception):
                await session.smtp.quit(timeout=_QUIT_SECONDS)
            session.smtp.close()

    # -- one message -------------------------------------------------------

    async def _deliver(self, sender: str, to: str, raw: bytes, ends: float) -> None:
        """MAIL, RCPT, DATA and the message on one session, kept for the next if it can be."""
        pooled = self._pooled()
        smtp = pooled or await self._connect(ends)
        try:
            try:
                await self._step(
                    Stage.MAIL,
                    ends,
                    lambda t: smtp.mail(sender, timeout=t),
                    stale=pooled is not None,
                )
            except _Stale:  # (b): nothing was sent on it; once more on a new session
                smtp.close()
                smtp = await self._connect(ends)
                await self._step(Stage.MAIL, ends, lambda t: smtp.mail(sender, timeout=t))
            await self._step(Stage.RCPT, ends, lambda t: smtp.rcpt(to, timeout=t))
            await self._step(Stage.DATA, ends, lambda t: _data_command(smtp, t))
            await self._step(Stage.MESSAGE, ends, lambda t: _message(smtp, raw, t))
        except (PermanentProviderError, TransientProviderError) as refused:
            await self._after_refusal(smtp, refused, ends)
            raise
        except BaseException:  # unknown outcome, cancelled, a bug: the session is unknown
            smtp.close()
            raise
        self._give_back(smtp)

    async def _step(
        self,
        stage: Stage,
        ends: float,
        call: Callable[[float], Awaitable[T]],
        *,
        stale: bool = False,
    ) -> T:
        """One command of the transaction, its failure translated (the module docstring)."""
        left = ends - time.monotonic()
        if left <= 0:
            raise TransientProviderError(f"Timeout before {stage}", provider=self.name)
        try:
            return await call(left)
        except aiosmtplib.SMTPResponseException as exc:
            if stale and exc.code == 421:  # the server closed the idle session
                raise _Stale from exc
            raise self._refused(stage, exc.code, exc.message) from exc
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            timed_out = isinstance(exc, TimeoutError)
            if stale and not timed_out:
                raise _Stale from exc
            why = "Timeout" if timed_out else "ConnectionLost"
            if stage is Stage.MESSAGE:  # the final `.` was written: it may have been taken
                raise UnknownOutcomeError(f"{why} after the message", provider=self.name) from exc
            raise TransientProviderError(f"{why} at {stage}", provider=self.name) from exc

    def _refused(self, stage: Stage, code: int, text: str) -> ProviderError:
        enhanced = _ENHANCED.match(text or "")
        status = f"{code} {enhanced.group(0)}" if enhanced else str(code)
        reason = f"{_REFUSED[stage]} {status}"
        if 400 <= code < 500:
            return TransientProviderError(reason, status=code, provider=self.name)
        if stage is Stage.CONNECT or code in _CONFIGURATION_CODES:
            return ProviderConfigurationError(reason, status=code, provider=self.name)
        if stage is Stage.RCPT and _address_gone(code, enhanced):
            return TargetGone(reason, status=code, provider=self.name)
        return PermanentProviderError(reason, status=code, provider=self.name)

    async def _after_refusal(
        self, smtp: aiosmtplib.SMTP, refused: ProviderError, ends: float
    ) -> None:
        """A reply refused the message: keep the session for the next one if RSET works
        within what is left of the send's time (its answer is due by `ends`)."""
        left = min(_QUIT_SECONDS, ends - time.monotonic())
        if left <= 0 or not smtp.is_connected or isinstance(refused, ProviderConfigurationError):
            smtp.close()
            return
        try:
            reply = await smtp.rset(timeout=left)
        except (aiosmtplib.SMTPException, OSError, TimeoutError):
            smtp.close()
            return
        if reply.code == 250:
            self._give_back(smtp)
        else:
            smtp.close()

    # -- sessions ----------------------------------------------------------

    def _pooled(self) -> aiosmtplib.SMTP | None:
        """An idle session still open and not idle too long; older ones are closed."""
        now = time.monotonic()
        while self._idle:
            session = self._idle.pop()
            if session.smtp.is_connected and now - session.idle_since < self.settings.idle_seconds:
                return session.smtp
            session.smtp.close()
        return None

    def _give_back(self, smtp: aiosmtplib.SMTP) -> None:
        if self._closed or not smtp.is_connected:
            smtp.close()
        else:
            self._idle.append(_Session(smtp=smtp, idle_since=time.monotonic()))

    async def _connect(self, ends: float) -> aiosmtplib.SMTP:
        """A new session: TCP, TLS, greeting, EHLO, STARTTLS and AUTH, within `ends`."""
        s = self.settings
        left = min(s.connect_timeout_seconds, ends - time.monotonic())
        if left <= 0:
            raise TransientProviderError("Timeout before connect", provider=self.name)
        if self._local_hostname is None:
            self._local_hostname = await asyncio.to_thread(socket.getfqdn)
        smtp = aiosmtplib.SMTP(
            hostname=s.host,
            port=s.server_port,
            username=s.username,
            password=s.password,
            local_hostname=self._local_hostname,
            timeout=left,
            use_tls=s.tls is SmtpTls.IMPLICIT,
            start_tls=s.tls is SmtpTls.STARTTLS,  # (c): required, never opportunistic
            tls_context=self._tls,
        )
        try:
            async with asyncio.timeout(left):
                await smtp.connect()
        except aiosmtplib.SMTPResponseException as exc:  # greeting, EHLO, STARTTLS, AUTH
            raise self._refused(Stage.CONNECT, exc.code, exc.message) from exc
        except ssl.SSLError as exc:  # the certificate or the handshake refused
            raise ProviderConfigurationError(
                f"TlsFailed {type(exc).__name__}", provider=self.name
            ) from exc
        except (aiosmtplib.SMTPConnectError, OSError, TimeoutError) as exc:
            if isinstance(exc.__cause__, ssl.SSLError):  # implicit TLS: wrapped by the library
                raise ProviderConfigurationError(
                    f"TlsFailed {type(exc.__cause__).__name__}", provider=self.name
                ) from exc
            raise TransientProviderError("ConnectFailed", provider=self.name) from exc
        except aiosmtplib.SMTPException as exc:  # STARTTLS or AUTH not offered
            raise ProviderConfigurationError(
                f"Unsupported: {exc.message}", provider=self.name
            ) from exc
        self.connections_opened += 1
        return smtp


async def _data_command(smtp: aiosmtplib.SMTP, seconds: float) -> None:
    """DATA alone, up to its 354 (trap (a)): nothing of the message is sent yet."""
    reply = await smtp.execute_command(b"DATA", timeout=seconds)
    if reply.code != 354:  # aiosmtplib's SMTPStatus.start_input
        raise aiosmtplib.SMTPDataError(reply.code, reply.message)


async def _message(smtp: aiosmtplib.SMTP, raw: bytes, seconds: float) -> None:
    """The message and its final `.`, then the reply (trap (a)): from the write on, the
    outcome of a timeout or a lost connection is unknown."""
    protocol = smtp.protocol
    if protocol is None:
        raise aiosmtplib.SMTPServerDisconnected("Connection lost")
    protocol.write(PERIOD_REGEX.sub(b"..", raw) + b".\r\n")
    try:
        reply = await protocol.read_response(timeout=seconds)
    except (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPTimeoutError):
        smtp.close()
        raise
    if not 200 <= reply.code < 300:
        raise aiosmtplib.SMTPDataError(reply.code, reply.message)


def _address_gone(code: int, enhanced: re.Match[str] | None) -> bool:
    """Whether a 5xx to RCPT says the address itself is dead, not a policy or a quota."""
    if enhanced is not None:
        subject, detail = enhanced.group(2), enhanced.group(3)
        return subject == "1" or (subject, detail) == ("2", "1")  # addressing; disabled
    return code in _GONE_CODES
