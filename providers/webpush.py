"""Web Push (RFC 8030) through pywebpush and py-vapid, one POST per attempt, on aiohttp.

pywebpush encrypts the payload for the subscription (RFC 8291 aes128gcm, by
http_ece) and py-vapid signs the VAPID JWT (RFC 8292); the POST is ours, on one
`aiohttp.ClientSession`, so a send costs no thread. (Not httpx: its connection
pool took 3 to 4 times aiohttp's time per request at 20 concurrent requests to
one origin here, encode/httpx#3215, and pywebpush brings aiohttp anyway.)
What we do instead of pywebpush's own sending:

(a) `webpush()` / `webpush_async()` sign a fresh JWT on every send (an ECDSA
    signature each) and mutate the claims dict they are given. Here one JWT per
    audience (the endpoint's origin) is signed and reused until REFRESH_SECONDS
    before its `exp` (`VapidTokens`).
(b) their POST goes through requests, or aiohttp with a session per call unless
    given one, and raises one `WebPushException` for every status. Here
    the status, Location and Retry-After are read and mapped once
    (`providers.webpush_wire`); nothing is retried inside.
(c) `WebPusher` accepts any p256dh (its length check can never fail) and any
    endpoint. Here `subscription_problem` refuses a bad key or a private host
    before anything is encrypted or sent (`InvalidDeviceToken`: prune it).

One `send` is one attempt. A connection that failed before the request was
written (refused, TLS, connect timeout, no pooled connection in time) is
transient; a timeout or a connection lost after it may have arrived is an
unknown outcome. A POST starts only if its read timeout and MIN_CONNECT_SECONDS
fit before the caller's deadline, its connect timeout cut to what is left
(else `NotStartedInTime`, nothing sent).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from cryptography.hazmat.primitives import serialization
from http_ece import ECEException
from py_vapid import Vapid, VapidException
from pywebpush import WebPusher, WebPushException

from providers.errors import (
    InvalidDeviceToken,
    NotStartedInTime,
    PermanentProviderError,
    TransientProviderError,
    UnknownOutcomeError,
)
from providers.ids import SendIds
from providers.provider import NEITHER, ProviderReceipt
from providers.push import Push
from providers.webpush_subscription import subscription_problem
from providers.webpush_wire import (
    MAX_ENCRYPTED_BYTES,
    PAYLOAD_TOO_LARGE,
    encrypted_size,
    webpush_body,
    webpush_headers,
    webpush_result,
)

__all__ = ["VapidTokens", "WebPushProvider", "WebPushSettings"]


MIN_CONNECT_SECONDS = 0.1  # the least connect timeout a POST starts with
TOKEN_SECONDS = 12 * 3600  # a VAPID JWT's lifetime (RFC 8292: at most 24 hours)
REFRESH_SECONDS = 3600  # signed anew this long before its exp
MAX_AUDIENCES = 1000  # JWTs kept (one per push service origin; a handful in practice)
DEFAULT_TTL_SECONDS = 28 * 24 * 3600  # kept by the push service while the browser is away


@dataclass(frozen=True, slots=True, kw_only=True)
class WebPushSettings:
    """Who we are to push services (VAPID) and how to reach them.

    `vapid_private_key`: our application server key, PEM text or the base64url
    raw/DER form py-vapid reads (`vapid --gen` makes one); its public half is what
    browsers subscribe with (`WebPushProvider.application_server_key`).
    `subject`: a `mailto:` or `https:` URL the push service can reach us at.
    `allow_hosts`: endpoint hosts exempt from the public-host rule, for tests and
    demos only (`providers.webpush_subscription`). `ca_file`: a CA bundle to trust
    instead of the system's (a local fake's test CA). `default_ttl_seconds`: the TTL
    of a push whose job sets none. `max_connections`: the connections open at once
    (over every push service), also `max_in_flight`: HTTP/1.1, one request each.
    """

    vapid_private_key: str
    subject: str
    timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 3.0
    max_connections: int = 100
    default_ttl_seconds: int = DEFAULT_TTL_SECONDS
    allow_hosts: frozenset[str] = field(default_factory=frozenset)
    ca_file: str | None = None


class VapidTokens:
    """The `Authorization: vapid t=..., k=...` header per audience, signed when due."""

    def __init__(self, vapid: Any, *, subject: str, clock: Callable[[], float] = time.time):
        self._vapid = vapid
        self._subject = subject
        self._clock = clock
        self._headers: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.signed = 0  # JWTs signed so far

    def header(self, audience: str) -> str:
        now = self._clock()
        cached = self._headers.get(audience)
        if cached is not None and now < cached[1]:
            return cached[0]
        exp = int(now) + TOKEN_SECONDS
        claims = {"aud": audience, "exp": exp, "sub": self._subject}
        try:
            header: str = self._vapid.sign(claims)["Authorization"]
        except VapidException as exc:  # a subject or audience py-vapid refuses
            raise ValueError(f"VAPID claims refused: {exc}") from exc
        self.signed += 1
        self._headers[audience] = (header, exp - REFRESH_SECONDS)
        self._headers.move_to_end(audience)
        while len(self._headers) > MAX_AUDIENCES:
            self._headers.popitem(last=False)
        return header


class WebPushProvider:
    """Sends Web Push subscriptions' pushes to their push services, one POST per send."""

    name = "webpush"
    recovery = NEITHER  # nothing to ask after a crash: the Topic is the backstop

    def __init__(self, settings: WebPushSettings) -> None:
        self.settings = settings
        self.answer_seconds = settings.timeout_seconds + MIN_CONNECT_SECONDS
        vapid = _vapid(settings.vapid_private_key)
        self.vapid = VapidTokens(vapid, subject=settings.subject)
        self.vapid.header("https://push.example.com")  # a bad subject fails here, at start
        self.application_server_key: str = _public_key(vapid)
        self._trust = ssl.create_default_context(cafile=settings.ca_file)  # None: the system's
        self._session: aiohttp.ClientSession | None = None  # made in the loop, on first use
        self._closed = False

    @property
    def max_in_flight(self) -> int:
        return self.settings.max_connections

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        if self._closed:
            raise TransientProviderError("ProviderClosed", provider=self.name)
        target, s = push.target, self.settings
        if not target.is_webpush or target.keys is None:
            raise PermanentProviderError("NotAWebPushSubscription", provider=self.name)
        problem = subscription_problem(target.token, target.keys, allow_hosts=s.allow_hosts)
        if problem is not None:
            raise InvalidDeviceToken(f"InvalidSubscription: {problem}", provider=self.name)
        plain = webpush_body(push, tag=ids.webpush_topic)
        if encrypted_size(len(plain)) > MAX_ENCRYPTED_BYTES:  # what a push service answers 413
            raise PermanentProviderError(PAYLOAD_TOO_LARGE, provider=self.name)
        answer_by = float("inf") if deadline is None else deadline
        connect = min(s.connect_timeout_seconds, answer_by - time.monotonic() - s.timeout_seconds)
        if connect < MIN_CONNECT_SECONDS:
            raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)
        endpoint = urlsplit(target.token)
        headers = webpush_headers(push, ids, default_ttl_seconds=s.default_ttl_seconds)
        headers["Authorization"] = self.vapid.header(f"https://{endpoint.netloc}")
        body = self._encrypt(push, plain)
        # `connect`: a pooled connection or a new one (TCP and TLS), nothing written yet.
        timeout = aiohttp.ClientTimeout(total=None, connect=connect, sock_read=s.timeout_seconds)
        try:
            async with (
                asyncio.timeout(connect + s.timeout_seconds),  # the whole POST, at most
                self._client().post(
                    target.token,
                    data=body,
                    headers=headers,
                    timeout=timeout,
                    allow_redirects=False,  # an endpoint is someone else's URL: go nowhere else
                ) as response,
            ):
                text = await response.text(errors="replace")
        except aiohttp.ConnectionTimeoutError as exc:
            raise TransientProviderError("ConnectTimeout", provider=self.name) from exc
        except aiohttp.ClientConnectorError as exc:  # refused, unreachable, TLS: none written
            raise TransientProviderError("ConnectFailed", provider=self.name) from exc
        except TimeoutError as exc:  # aiohttp's read timeout is one too
            raise UnknownOutcomeError("Timeout", provider=self.name) from exc
        except aiohttp.ClientError as exc:  # written, then lost: it may have arrived
            raise UnknownOutcomeError("ConnectionLost", provider=self.name) from exc
        return webpush_result(response.status, response.headers, text, provider=self.name)

    async def aclose(self) -> None:
        """Stop taking sends and close the connections (in-flight POSTs end as they end)."""
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                ssl=self._trust, limit=self.settings.max_connections, limit_per_host=0
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    def _encrypt(self, push: Push, plain: bytes) -> bytes:
        """The aes128gcm body for this subscription (RFC 8291), a fresh ephemeral key each."""
        keys = push.target.keys
        assert keys is not None
        subscription = {
            "endpoint": push.target.token,
            "keys": {"p256dh": keys.p256dh, "auth": keys.auth},
        }
        try:
            encoded = WebPusher(subscription).encode(plain, content_encoding="aes128gcm")
        except (WebPushException, ECEException, ValueError) as exc:
            raise InvalidDeviceToken("InvalidSubscriptionKeys", provider=self.name) from exc
        body: bytes = encoded["body"]
        return body


def _vapid(private_key: str) -> Any:
    """py-vapid's signer for a PEM key, or the base64url raw (32-byte) or DER form."""
    text = private_key.strip()
    try:
        if "-----BEGIN" in text:
            return Vapid.from_pem(text.encode())
        return Vapid.from_string(text)
    except Exception as exc:  # py-vapid raises whatever the key parser did
        raise ValueError("WebPushSettings.vapid_private_key: not a P-256 private key") from exc


def _public_key(vapid: Any) -> str:
    """Our public key as browsers take it (`applicationServerKey`): base64url, unpadded."""
    raw = vapid.public_key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
