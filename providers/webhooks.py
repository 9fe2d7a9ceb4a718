"""Webhooks per the Standard Webhooks specification, one POST per attempt, on aiohttp.

Every call carries three headers (https://www.standardwebhooks.com):

    webhook-id         `msg_` + the hex of the target's `effect_id`: stable per job and
                       endpoint, the same on every retry and after a crash, so a
                       receiver dedupes by it (`webhook_id`)
    webhook-timestamp  the attempt's time, integer Unix seconds
    webhook-signature  `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, one per
                       live secret of the endpoint, space-separated (while a secret
                       rotates, the new one signs beside the old)

The signing is the `standardwebhooks` package's (`Webhook(secret).sign`), the same
library a receiver verifies with; nothing here computes an HMAC.

What an answer means (`WebhookSender.send`):

    2xx                     sent; the receipt's id is the webhook-id (the receiver's
                            own ids are not standard: the webhook-id is what both
                            sides know the call by)
    410 Gone                `TargetGone`: the endpoint is disabled (its kind's `gone`)
    408, 429, 5xx           `TransientProviderError`, with the answer's Retry-After
    3xx                     `PermanentProviderError`: redirects are not followed; a
                            webhook endpoint must be its final URL (the specification
                            says the same: update the URL instead)
    other 4xx               `PermanentProviderError` with the status
    refused, DNS, no free   `TransientProviderError`: nothing was written
    connection in time
    timeout or connection   `UnknownOutcomeError`: the request may have been written,
    lost after connecting   so it may have arrived; a resend carries the same webhook-id

An answer's body is read up to MAX_ANSWER_BYTES (the rest is not read, and its
connection is not reused); a refusal's reason quotes at most its first
QUOTED_ANSWER_CHARS printable characters, never the whole body. One call is one
attempt: aiohttp makes no retry of its own and follows no redirect here, and the
whole call, from taking a pooled connection to reading the answer, is bounded by
`answer_seconds`. The client does not read proxy settings from the environment; a
`proxy` (an egress proxy that keeps calls away from internal addresses, as the
specification advises against SSRF) and `verify` (an `ssl.SSLContext` trusting a
private CA) are given explicitly.

The transport is one `aiohttp.ClientSession` on the worker's event loop, not httpx:
at 64 calls in flight to one receiver answering in 20 ms, httpx's connection pool
(httpcore 1.0.9) gave 130 to 150 calls a second on this 2-core machine where
aiohttp gave 1,430 to 1,510, the same receiver, the same process (encode/httpx#3215:
its pool hands one idle connection to several waiters at once); Web Push and FCM
moved to aiohttp for the same reason.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from datetime import UTC, datetime

import aiohttp
from standardwebhooks import Webhook

from providers.errors import (
    NotStartedInTime,
    PermanentProviderError,
    TargetGone,
    TransientProviderError,
    UnknownOutcomeError,
    retry_after_seconds,
)
from providers.ids import SendIds
from providers.provider import NEITHER, ProviderReceipt
from providers.webhook_call import WebhookCall, webhook_id

MAX_ANSWER_BYTES = 64 * 1024
QUOTED_ANSWER_CHARS = 100
GONE_REASON = "gone: HTTP 410"  # also the disabled endpoint's reason
TRANSIENT_4XX = frozenset({408, 429})  # the receiver timed out reading us; a rate limit


def signature_header(call: WebhookCall, message_id: str, at: datetime) -> str:
    """`webhook-signature`: one `v1,...` per secret, space-separated, by `standardwebhooks`."""
    body = call.body.decode()
    return " ".join(Webhook(secret).sign(message_id, at, body) for secret in call.secrets)


class WebhookSender:
    """Sends `WebhookCall`s (a `providers.Sender[WebhookCall]`); see the module docstring.

    `timeout_seconds` bounds a whole call (its `answer_seconds`; the specification
    recommends 15 to 30 s for a receiver to answer); `connect_timeout_seconds` the
    wait for a pooled connection and the connect. The pool holds `max_in_flight`
    connections: the runner hands it no more calls at once."""

    name = "webhook"
    recovery = NEITHER  # receivers dedupe by webhook-id; nothing can be asked

    def __init__(
        self,
        *,
        timeout_seconds: float = 15.0,
        connect_timeout_seconds: float = 5.0,
        max_in_flight: int = 64,
        proxy: str | None = None,
        verify: ssl.SSLContext | bool = True,
        user_agent: str = "idempotent-workers",
    ) -> None:
        if not 0 < connect_timeout_seconds <= timeout_seconds:
            raise ValueError("connect_timeout_seconds must be positive and within timeout_seconds")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.answer_seconds = timeout_seconds
        self._connect_seconds = connect_timeout_seconds
        self._max_in_flight = max_in_flight
        self._user_agent = user_agent
        self._proxy = proxy
        self._verify = verify
        self._session: aiohttp.ClientSession | None = None  # made in the loop, on first use
        self._closed = False

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    async def send(
        self, effect: WebhookCall, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        if self._closed:
            raise TransientProviderError("SenderClosed", provider=self.name)
        if deadline is not None and time.monotonic() > deadline - self.answer_seconds:
            raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)
        message_id = webhook_id(ids)
        now = datetime.now(UTC)
        headers = {
            "content-type": "application/json",
            "user-agent": self._user_agent,
            "webhook-id": message_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature_header(effect, message_id, now),
        }
        try:
            async with asyncio.timeout(self.answer_seconds):
                status, retry_after, quoted = await self._post(effect, headers)
        except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as exc:
            raise PermanentProviderError(f"BadUrl: {exc}", provider=self.name) from exc
        except aiohttp.ConnectionTimeoutError as exc:  # no pooled or new connection in time
            raise TransientProviderError("ConnectTimeout", provider=self.name) from exc
        except aiohttp.ClientConnectorError as exc:  # refused, DNS, TLS: nothing written
            raise TransientProviderError(_named(exc), provider=self.name) from exc
        except TimeoutError as exc:  # the whole call's bound, after it may have been written
            raise UnknownOutcomeError("Timeout", provider=self.name) from exc
        except aiohttp.ClientError as exc:  # written, then lost: it may have arrived
            raise UnknownOutcomeError(_named(exc), provider=self.name) from exc
        return self._receipt(status, retry_after, quoted, message_id)

    async def _post(
        self, call: WebhookCall, headers: dict[str, str]
    ) -> tuple[int, str | None, str]:
        """One POST; the status, Retry-After and the start of the answer's body."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self._connect_seconds)
        async with self._client().post(
            call.url,
            data=call.body,
            headers=headers,
            timeout=timeout,
            allow_redirects=False,  # a webhook endpoint is its final URL
            proxy=self._proxy,
        ) as response:
            read = bytearray()
            while len(read) < MAX_ANSWER_BYTES:
                chunk = await response.content.read(MAX_ANSWER_BYTES - len(read))
                if not chunk:
                    break
                read += chunk
            if not response.content.at_eof():
                response.close()  # the rest is never read; the connection is not reused
            return response.status, response.headers.get("retry-after"), _quoted(bytes(read))

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_in_flight,
                limit_per_host=0,
                ssl=self._verify,  # an SSLContext trusting a private CA, True, or False
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Content-Type"),
                trust_env=False,
            )
        return self._session

    def _receipt(
        self, status: int, retry_after: str | None, quoted: str, message_id: str
    ) -> ProviderReceipt:
        if 200 <= status < 300:
            return ProviderReceipt(provider=self.name, provider_message_id=message_id)
        if status == 410:
            raise TargetGone(GONE_REASON, status=status, provider=self.name)
        said = f": {quoted}" if quoted else ""
        if status in TRANSIENT_4XX or status >= 500:
            raise TransientProviderError(
                f"HTTP {status}{said}",
                status=status,
                provider=self.name,
                retry_after=retry_after_seconds(retry_after),
            )
        if 300 <= status < 400:
            reason = f"HTTP {status}: redirect not followed (a webhook URL must be final)"
            raise PermanentProviderError(reason, status=status, provider=self.name)
        raise PermanentProviderError(f"HTTP {status}{said}", status=status, provider=self.name)

    async def aclose(self) -> None:
        """Stop taking calls and close the connections (calls in flight end with them)."""
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            await self._session.close()


def _named(exc: BaseException) -> str:
    """An aiohttp error as a reason: its type, and its text when it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__


def _quoted(body: bytes) -> str:
    """At most QUOTED_ANSWER_CHARS printable characters of an answer's body."""
    text = body[: QUOTED_ANSWER_CHARS * 4].decode("utf-8", "replace")
    printable = "".join(c if c.isprintable() else " " for c in text)
    return " ".join(printable.split())[:QUOTED_ANSWER_CHARS]
