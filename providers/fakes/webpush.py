"""A local Web Push service: HTTPS on 127.0.0.1, checking and decrypting like a real one.

```python
async with FakeWebPush() as push_service:
    browser = push_service.subscribe("alice")          # a browser's subscription
    provider = WebPushProvider(push_service.settings())  # our VAPID key, its CA
    ...
    assert push_service.requests_for(browser)[0].payload["title"] == "Shipped"
```

It does what a push service does with every request, in this order, before any
scripted answer: an unknown endpoint is 404, an unsubscribed one 410; the
`Authorization: vapid t=..., k=...` JWT is verified (ES256 against `k`, `aud` the
endpoint's origin, `exp` in the future and within 24 hours, a `sub`; a
subscription made for another application server key refuses it) with PyJWT,
not with the py-vapid that signed it: missing is 401, invalid 403; `TTL`,
`Content-Encoding: aes128gcm`, `Topic` (at most 32 URL-safe base64 characters)
and `Urgency` are checked (400); a body over 4,096 bytes is 413; the body is
decrypted with the subscription's private key and auth secret (RFC 8291; 400 if
it does not decrypt). Each refusal is kept in `.refusals`. A request that passed
is kept in `.requests` with its plain text, then answered as scripted (by
default 201 with a `Location`); an accepted message waits in `pending(...)`,
where one with the same Topic replaces it, until `deliver(...)` takes them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
import tempfile
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import http_ece
import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from providers.fakes.tls import LocalCertificates, make_apns_signing_key, make_local_certificates
from providers.push import Platform, Target, WebPushKeys
from providers.webpush import WebPushSettings
from providers.webpush_wire import MAX_ENCRYPTED_BYTES

MAX_JWT_SECONDS = 24 * 3600  # RFC 8292 4.2: exp no more than 24 hours from now
_TOPIC = re.compile(r"[A-Za-z0-9_-]{1,32}")
_URGENCIES = frozenset({"very-low", "low", "normal", "high"})


@dataclass(frozen=True, slots=True, kw_only=True)
class WebPushReply:
    """How the fake answers a request that passed its checks: after `latency` seconds,
    `status` (with `Retry-After` when set), or drop the connection (after reading the
    request, before answering). With `until`, it answers once the test sets it."""

    status: int = 201
    latency: float = 0.0
    drop: bool = False
    retry_after: int | None = None
    until: asyncio.Event | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeSubscription:
    """A browser's subscription: what it hands the app (`target`) and its private half."""

    name: str
    endpoint: str
    keys: WebPushKeys
    private_key: ec.EllipticCurvePrivateKey
    auth_secret: bytes
    application_server_key: str | None  # restricted to this sender key, if set

    @property
    def target(self) -> Target:
        return Target(platform=Platform.WEB, token=self.endpoint, keys=self.keys)

    def job_target(self) -> dict[str, Any]:
        """As a push job names it: `PushSubscription.toJSON()` with the platform."""
        keys = {"p256dh": self.keys.p256dh, "auth": self.keys.auth}
        return {"platform": "web", "endpoint": self.endpoint, "keys": keys}


@dataclass(frozen=True, slots=True, kw_only=True)
class WebPushRequest:
    """One request that passed the checks: its headers, VAPID claims and plain text."""

    subscription: str  # its name
    endpoint: str
    topic: str | None
    ttl: int
    urgency: str | None
    claims: Mapping[str, Any]
    vapid_key: str
    vapid_token: str
    headers: Mapping[str, str]
    plaintext: bytes
    encrypted_bytes: int
    received_at: float

    @property
    def payload(self) -> Any:
        return json.loads(self.plaintext)


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingMessage:
    """A message accepted and not yet delivered to the browser."""

    location: str
    topic: str | None
    plaintext: bytes


@dataclass(slots=True)
class _Script:
    reply: WebPushReply
    remaining: int | None


@dataclass(slots=True)
class _State:
    subscription: FakeSubscription
    gone: bool = False
    pending: list[PendingMessage] = field(default_factory=list)


class FakeWebPush:
    """A fake push service; `.subscribe()` makes subscriptions, `.script()` sets answers."""

    def __init__(
        self,
        *,
        subject: str = "mailto:push@example.com",
        unscripted: WebPushReply | None = None,
        checks: bool = True,
    ) -> None:
        self.subject = subject
        # False only where the sender's speed, not the fake's, is measured (proving.bench):
        # then requests are recorded unverified and undecrypted (empty plaintext).
        self.checks = checks
        self.requests: list[WebPushRequest] = []
        self.refusals: list[str] = []  # why a request was refused by the checks
        self.unscripted = unscripted or WebPushReply()  # the answer to a name with no script
        self.vapid_private_key = make_apns_signing_key()  # a P-256 PEM: our sender's key
        self._by_path: dict[str, _State] = {}
        self._by_name: dict[str, _State] = {}
        self._scripts: dict[str, deque[_Script]] = {}
        self._messages = 0
        self._runner: web.AppRunner | None = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        self._certificates: LocalCertificates | None = None

    async def __aenter__(self) -> Self:
        self._directory = tempfile.TemporaryDirectory(prefix="fake-webpush-")
        self._certificates = make_local_certificates(Path(self._directory.name))
        app = web.Application()
        app.router.add_post("/push/{id}", self._push)
        self._runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            "127.0.0.1",
            0,
            ssl_context=self._certificates.server_context(alpn=("http/1.1",)),
        )
        await site.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._directory is not None:
            self._directory.cleanup()

    @property
    def port(self) -> int:
        assert self._runner is not None, "use FakeWebPush as an async context manager"
        port: int = self._runner.addresses[0][1]
        return port

    @property
    def origin(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        assert self._certificates is not None, "use FakeWebPush as an async context manager"
        return self._certificates.ca_file

    def settings(self, **overrides: Any) -> WebPushSettings:
        """Our sender's settings: this fake's VAPID key, its CA, 127.0.0.1 allowed."""
        values: dict[str, Any] = {
            "vapid_private_key": self.vapid_private_key,
            "subject": self.subject,
            "ca_file": str(self.ca_file),
        }
        return self.sender_settings(**(values | overrides))

    @staticmethod
    def sender_settings(**values: Any) -> WebPushSettings:
        """Settings for a sender to a fake on 127.0.0.1 (its host allowed), from a worker
        process that has the fake's key and CA but not the fake itself."""
        return WebPushSettings(**({"allow_hosts": frozenset({"127.0.0.1"})} | values))

    def subscribe(
        self, name: str, *, application_server_key: str | None = None
    ) -> FakeSubscription:
        """A new subscription under this fake's origin (a fresh key pair and auth secret)."""
        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        auth = secrets.token_bytes(16)
        path = secrets.token_urlsafe(16)
        subscription = FakeSubscription(
            name=name,
            endpoint=f"{self.origin}/push/{path}",
            keys=WebPushKeys(p256dh=_b64(public), auth=_b64(auth)),
            private_key=key,
            auth_secret=auth,
            application_server_key=application_server_key,
        )
        self._by_path[path] = self._by_name[name] = _State(subscription=subscription)
        return subscription

    def unsubscribe(self, name: str) -> None:
        """The browser dropped it: its endpoint answers 410 Gone from now on."""
        self._by_name[name].gone = True

    def script(
        self,
        name: str,
        *,
        status: int = 201,
        latency: float = 0.0,
        drop: bool = False,
        retry_after: int | None = None,
        until: asyncio.Event | None = None,
        times: int | None = None,
    ) -> None:
        """Answer the next `times` requests (all, if None) to `name` this way; scripts queue."""
        reply = WebPushReply(
            status=status, latency=latency, drop=drop, retry_after=retry_after, until=until
        )
        self._scripts.setdefault(name, deque()).append(_Script(reply=reply, remaining=times))

    def requests_for(self, subscription: str | FakeSubscription) -> list[WebPushRequest]:
        name = subscription if isinstance(subscription, str) else subscription.name
        return [r for r in self.requests if r.subscription == name]

    def pending(self, subscription: str | FakeSubscription) -> list[PendingMessage]:
        name = subscription if isinstance(subscription, str) else subscription.name
        return list(self._by_name[name].pending)

    def deliver(self, subscription: str | FakeSubscription) -> list[PendingMessage]:
        """The browser came online: its pending messages, taken."""
        name = subscription if isinstance(subscription, str) else subscription.name
        state = self._by_name[name]
        taken, state.pending = state.pending, []
        return taken

    def reply_for(self, name: str) -> WebPushReply:
        scripts = self._scripts.get(name)
        while scripts:
            script = scripts[0]
            if script.remaining is None:
                return script.reply
            if script.remaining > 0:
                script.remaining -= 1
                return script.reply
            scripts.popleft()
        return self.unscripted

    async def _push(self, request: web.Request) -> web.StreamResponse:
        state = self._by_path.get(request.match_info["id"])
        if state is None:
            return web.Response(status=404, text="no such subscription")
        if state.gone:
            return web.Response(status=410, text="unsubscribed")
        sub = state.subscription
        body = await request.read()
        checked = self._check(request, sub, body) if self.checks else ({}, "", "", b"")
        if isinstance(checked, web.Response):
            return checked
        claims, key, token, plaintext = checked
        topic = request.headers.get("Topic")
        self.requests.append(
            WebPushRequest(
                subscription=sub.name,
                endpoint=sub.endpoint,
                topic=topic,
                ttl=int(request.headers.get("TTL", "0")),
                urgency=request.headers.get("Urgency"),
                claims=claims,
                vapid_key=key,
                vapid_token=token,
                headers=dict(request.headers),
                plaintext=plaintext,
                encrypted_bytes=len(body),
                received_at=time.monotonic(),
            )
        )
        reply = self.reply_for(sub.name)
        if reply.until is not None:
            await reply.until.wait()
        if reply.latency > 0:
            await asyncio.sleep(reply.latency)
        if reply.drop:
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=599)  # never written: the connection is gone
        extra = {"Retry-After": str(reply.retry_after)} if reply.retry_after is not None else {}
        if reply.status != 201:
            return web.Response(status=reply.status, text="scripted", headers=extra)
        self._messages += 1
        location = f"{self.origin}/m/{self._messages}"
        if topic is not None:  # RFC 8030 5.4: a pending message of this topic is replaced
            state.pending = [m for m in state.pending if m.topic != topic]
        state.pending.append(PendingMessage(location=location, topic=topic, plaintext=plaintext))
        return web.Response(status=201, headers={"Location": location, **extra})

    def _check(
        self, request: web.Request, sub: FakeSubscription, body: bytes
    ) -> web.Response | tuple[dict[str, Any], str, str, bytes]:
        """The push service's checks, in its order; a refusal as the response to send."""
        scheme, _, params = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "vapid":
            return self._refuse(401, "no vapid authorization")
        parts = dict(p.strip().partition("=")[::2] for p in params.split(","))
        token, key = parts.get("t", ""), parts.get("k", "")
        try:
            public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), _unb64(key))
            claims: dict[str, Any] = jwt.decode(
                token,
                public,
                algorithms=["ES256"],
                audience=self.origin,
                options={"require": ["aud", "exp", "sub"]},
            )
        except (ValueError, jwt.PyJWTError) as exc:
            return self._refuse(403, f"vapid: {type(exc).__name__}: {exc}")
        if claims["exp"] > time.time() + MAX_JWT_SECONDS:
            return self._refuse(403, "vapid: exp more than 24 hours ahead")
        if sub.application_server_key is not None and key != sub.application_server_key:
            return self._refuse(403, "vapid: not the key this subscription was made for")
        ttl = request.headers.get("TTL", "")
        if not ttl.isdigit():
            return self._refuse(400, "TTL: a non-negative integer is required")
        if request.headers.get("Content-Encoding") != "aes128gcm":
            return self._refuse(400, "Content-Encoding: aes128gcm is required")
        topic = request.headers.get("Topic")
        if topic is not None and not _TOPIC.fullmatch(topic):
            return self._refuse(400, f"Topic: 1 to 32 URL-safe base64 characters, not {topic!r}")
        urgency = request.headers.get("Urgency")
        if urgency is not None and urgency not in _URGENCIES:
            return self._refuse(400, f"Urgency: one of {sorted(_URGENCIES)}")
        if len(body) > MAX_ENCRYPTED_BYTES:
            return self._refuse(413, f"payload of {len(body)} bytes")
        try:
            plaintext = http_ece.decrypt(
                body, private_key=sub.private_key, auth_secret=sub.auth_secret, version="aes128gcm"
            )
        except Exception as exc:  # http_ece raises ECEException, cryptography InvalidTag
            return self._refuse(400, f"does not decrypt: {type(exc).__name__}")
        return claims, key, token, bytes(plaintext)

    def _refuse(self, status: int, reason: str) -> web.Response:
        self.refusals.append(f"{status} {reason}")
        return web.Response(status=status, text=reason)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
