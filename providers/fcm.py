"""FCM (HTTP v1): pyfcm builds the message, one aiohttp POST per attempt on the caller's loop.

pyfcm builds the payload (`parse_payload`, the JSON body its `notify` POSTs) and
resolves the project's endpoint; the POST and the OAuth token are ours, because
pyfcm's own send paths can send one push twice, never return, or cost a
millisecond of CPU per push:

- its transport (requests) retries 502/503 (and its session any connection error)
  invisibly, and `send_request` sleeps on Retry-After and POSTs again, forever on a
  persistent 429. Here the POST is made once (aiohttp never retries a POST, and no
  redirect is followed), with status, FCM error code and Retry-After surfaced.
- a read timeout re-POSTs (a double send). Here it is `UnknownOutcomeError`.
- it is synchronous (requests, so one thread per POST in flight) and its async
  helper (aiohttp, a session per request) fails inside a running loop. Here one
  aiohttp session on the caller's loop keeps up to `max_connections` keep-alive
  connections. The threads cost about 1 ms of worker CPU per push, twelve times
  an APNs send: requests reads the environment for proxies and netrc and stats
  its CA bundle on every request, and each answer crosses threads and the GIL
  (issue 56; docs/push.md). aiohttp's C parser costs about a tenth of that.
- a service-account file is loaded lazily by whichever thread sends first, and
  concurrent first sends race: credentials are built once, here, up front.
- it fetches an OAuth token per thread: here one token per credential is shared
  by every send (`providers.fcm_token`), fetched in a thread off the event loop
  only when google-auth says it is due, and a 401 drops it for a fresh one.

A send waits for one of `max_connections` slots (first in, first out) before its
POST starts; with a `deadline`, a POST starts only if its read timeout and at
least MIN_CONNECT_SECONDS fit before it, and its connect timeout is cut to what
is left: a POST that connects too late fails (`ConnectTimeout`, nothing sent)
instead of being answered after the deadline, and the whole request is bounded
by the two. One that cannot start is not made: `NotStartedInTime`, nothing sent.
`answer_seconds` (read timeout plus MIN_CONNECT_SECONDS) is what a deadline must
leave. Our credentials or project refused (401, 403 other than
SENDER_ID_MISMATCH, an OAuth refresh refused) is `ProviderConfigurationError`:
no push is at fault.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from google.auth.credentials import Credentials
from google.oauth2 import service_account
from pyfcm import FCMNotification
from pyfcm.errors import FCMError

from providers.errors import (
    InvalidDeviceToken,
    NotStartedInTime,
    PermanentProviderError,
    ProviderConfigurationError,
    TransientProviderError,
    UnknownOutcomeError,
    retry_after_seconds,
)
from providers.fcm_token import FcmAccessToken
from providers.ids import SendIds
from providers.provider import NEITHER, ProviderReceipt
from providers.push import Priority, Push

GOOGLE_BASE_URL = "https://fcm.googleapis.com"
MESSAGING_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
INVALID_TOKEN_CODES = frozenset({"UNREGISTERED"})
TRANSIENT_CODES = frozenset({"QUOTA_EXCEEDED", "UNAVAILABLE", "INTERNAL"})
TOKEN_FORBIDDEN_CODES = frozenset({"SENDER_ID_MISMATCH"})  # a 403 about the device, not us
CONFIGURATION_CODES = frozenset({"THIRD_PARTY_AUTH_ERROR", "PERMISSION_DENIED"})
# The least connect timeout a POST starts with: a pooled keep-alive connection needs
# none, a new one to a nearby endpoint a few milliseconds.
MIN_CONNECT_SECONDS = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class FcmSettings:
    """How to reach FCM: credentials (a google-auth `Credentials`, or a service-account
    file path), the project (defaults to the credentials' own), and the limits:
    `max_connections` POSTs in flight at once, each on its own keep-alive connection."""

    credentials: Credentials | str | Path
    project_id: str | None = None
    base_url: str = GOOGLE_BASE_URL
    timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 3.0
    max_connections: int = 100


class FcmProvider:
    """Sends Android and web pushes (and FCM-registered iOS ones) via FCM HTTP v1."""

    name = "fcm"
    recovery = NEITHER  # the collapse key is the backstop

    def __init__(self, settings: FcmSettings) -> None:
        if settings.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.settings = settings
        self.answer_seconds = settings.timeout_seconds + MIN_CONNECT_SECONDS
        credentials = settings.credentials
        if isinstance(credentials, str | Path):
            # google-auth leaves this classmethod unannotated
            credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                str(credentials), scopes=[MESSAGING_SCOPE]
            )
        self._fcm = FCMNotification(credentials=credentials, project_id=settings.project_id)
        self._fcm.FCM_END_POINT_BASE = settings.base_url.rstrip("/") + "/v1/projects"
        self.token = FcmAccessToken(credentials, provider=self.name)
        self._slots = asyncio.Semaphore(settings.max_connections)
        self._session: aiohttp.ClientSession | None = None  # made on the loop, at first use
        self._sending = 0
        self._drained: asyncio.Event | None = None
        self._closed = False

    @property
    def max_in_flight(self) -> int:
        return self.settings.max_connections

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        if self._closed:
            raise TransientProviderError("ProviderClosed", provider=self.name)
        answer_by = float("inf") if deadline is None else deadline
        if time.monotonic() > answer_by - self.answer_seconds:
            raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)
        payload = self._payload(push, ids)
        self._sending += 1
        try:
            async with self._slots:
                return await self._post(payload, answer_by)
        finally:
            self._sending -= 1
            if self._drained is not None and not self._sending:
                self._drained.set()

    async def aclose(self) -> None:
        """Stop taking sends, wait for the ones in flight (each bounded by its timeouts)."""
        if self._closed:
            return
        self._closed = True
        if self._sending:
            self._drained = asyncio.Event()
            await self._drained.wait()
        if self._session is not None:
            await self._session.close()

    def _payload(self, push: Push, ids: SendIds) -> bytes:
        note = push.notification
        visible = note.title is not None or note.body is not None
        android: dict[str, Any] = {"collapse_key": ids.fcm_collapse_key}
        webpush_headers = {"Topic": ids.webpush_topic}
        apns_headers = {"apns-collapse-id": ids.collapse_id}
        if visible:
            android["notification"] = {"tag": ids.fcm_collapse_key}
        if push.priority is not None:
            high = push.priority is Priority.HIGH
            android["priority"] = "HIGH" if high else "NORMAL"
            webpush_headers["Urgency"] = "high" if high else "normal"
            apns_headers["apns-priority"] = "10" if high else "5"
        if push.ttl_seconds is not None:
            android["ttl"] = f"{max(push.ttl_seconds, 0)}s"
            webpush_headers["TTL"] = str(max(push.ttl_seconds, 0))
        try:
            payload: bytes = self._fcm.parse_payload(
                fcm_token=push.target.token,
                notification_title=note.title,
                notification_body=note.body,
                data_payload=dict(note.data) or None,
                android_config=android,
                apns_config={"headers": apns_headers},
                webpush_config={"headers": webpush_headers},
            )
        except FCMError as exc:
            raise PermanentProviderError(f"InvalidPayload: {exc}", provider=self.name) from exc
        return payload

    async def _post(self, payload: bytes, answer_by: float) -> ProviderReceipt:
        """One POST, unless it is too late to start. Nothing retries."""
        authorization = await self.token.header()  # the shared token, fetched when due
        try:
            url = self._fcm.fcm_end_point
        except FCMError as exc:
            raise ProviderConfigurationError("NoProjectId", provider=self.name) from exc
        s = self.settings
        # Connecting may take what the read timeout leaves before the deadline.
        connect = min(s.connect_timeout_seconds, answer_by - time.monotonic() - s.timeout_seconds)
        if connect < MIN_CONNECT_SECONDS:  # waited for a slot or the token too long
            raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)
        timeout = aiohttp.ClientTimeout(
            total=connect + s.timeout_seconds, connect=connect, sock_read=s.timeout_seconds
        )
        headers = {"Content-Type": "application/json", "Authorization": authorization}
        try:
            async with self._client().post(
                url, data=payload, headers=headers, timeout=timeout, allow_redirects=False
            ) as response:
                status, content = response.status, await response.read()
                retry_after = response.headers.get("Retry-After")
        except aiohttp.ConnectionTimeoutError as exc:  # no connection in time: not sent
            raise TransientProviderError("ConnectTimeout", provider=self.name) from exc
        except aiohttp.ClientConnectorError as exc:  # refused, unreachable, TLS: not sent
            raise TransientProviderError("ConnectFailed", provider=self.name) from exc
        except TimeoutError as exc:  # written, no answer in time
            raise UnknownOutcomeError("Timeout", provider=self.name) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise UnknownOutcomeError("ConnectionLost", provider=self.name) from exc
        except aiohttp.ClientError as exc:
            raise UnknownOutcomeError(type(exc).__name__, provider=self.name) from exc
        if status == 401:
            self.token.refused(authorization)  # fetch a fresh token on the next send
        return self._receipt(status, content, retry_after)

    def _client(self) -> aiohttp.ClientSession:
        """The session every send shares: its connections are kept alive, never retried."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.settings.max_connections)
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    def _receipt(self, status: int, content: bytes, retry_after: str | None) -> ProviderReceipt:
        error = _error(content)
        code = error.get("code") or error.get("status") or f"HTTP{status}"
        if status == 200:
            name = error.get("name")
            if not name:
                raise UnknownOutcomeError("AnswerWithoutName", status=status, provider=self.name)
            return ProviderReceipt(provider=self.name, provider_message_id=name)
        if code in INVALID_TOKEN_CODES or error.get("about_token"):
            raise InvalidDeviceToken(code, status=status, provider=self.name)
        if (
            status == 401
            or (status == 403 and code not in TOKEN_FORBIDDEN_CODES)
            or code in CONFIGURATION_CODES
        ):
            raise ProviderConfigurationError(code, status=status, provider=self.name)
        if status == 429 or status >= 500 or code in TRANSIENT_CODES:
            raise TransientProviderError(
                code,
                status=status,
                provider=self.name,
                retry_after=retry_after_seconds(retry_after),
            )
        raise PermanentProviderError(code, status=status, provider=self.name)


def _error(content: bytes) -> Mapping[str, str]:
    """The message name of a 200, or the FCM error code / status of an error, as strings."""
    try:
        body = json.loads(content or b"{}")
    except ValueError:
        return {}
    if not isinstance(body, dict):
        return {}
    if "name" in body:
        return {"name": str(body["name"])}
    error = body.get("error")
    if not isinstance(error, dict):
        return {}
    found = {"status": str(error.get("status", ""))}
    for detail in error.get("details") or ():
        if not isinstance(detail, dict):
            continue
        if detail.get("errorCode"):
            found["code"] = str(detail["errorCode"])
        for violation in detail.get("fieldViolations") or ():
            if isinstance(violation, dict) and violation.get("field") == "message.token":
                found["about_token"] = "yes"
    if "registration token" in str(error.get("message", "")):
        found["about_token"] = "yes"
    return {k: v for k, v in found.items() if v}
