"""FCM (HTTP v1) through pyfcm, one POST per attempt, from a bounded thread pool.

pyfcm builds the payload and holds the OAuth session; the POST is ours, because
pyfcm's own send path can send one push twice or never return:

- its transport retries 502/503 (and its session any connection error) invisibly,
  and `send_request` sleeps on Retry-After and POSTs again, forever on a persistent
  429. Here the session's adapter has `Retry(total=0)` and the POST is made once,
  with status, FCM error code and Retry-After surfaced.
- a read timeout re-POSTs (a double send). Here it is `UnknownOutcomeError`.
- it is synchronous (requests) and its async helper fails inside a running loop:
  sends run in a `ThreadPoolExecutor` of `max_workers` threads.
- a service-account file is loaded lazily by whichever thread sends first, and
  concurrent first sends race: credentials are built once, here, up front.
- it fetches an OAuth token per thread: here one token per credential is shared
  by all threads (`providers.fcm_token`), and a 401 drops it for a fresh one.

A send waits in the thread pool's queue before its POST starts; with a
`deadline`, a POST starts only if its read timeout and at least
MIN_CONNECT_SECONDS fit before it, and its connect timeout is cut to what is
left: a POST that connects too late fails (`ConnectTimeout`, nothing sent)
instead of being answered after the deadline. One that cannot start is not made:
`NotStartedInTime`, nothing sent. `answer_seconds` (read timeout plus
MIN_CONNECT_SECONDS) is what a deadline must leave. Our credentials or
project refused (401, 403 other than SENDER_ID_MISMATCH, an OAuth refresh
refused) is `ProviderConfigurationError`: no push is at fault.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import structlog
from google.auth.credentials import Credentials
from google.oauth2 import service_account
from pyfcm import FCMNotification
from pyfcm.errors import FCMError
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util.retry import Retry

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

log = structlog.get_logger(__name__)

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
    file path), the project (defaults to the credentials' own), and the limits."""

    credentials: Credentials | str | Path
    project_id: str | None = None
    base_url: str = GOOGLE_BASE_URL
    timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 3.0
    max_workers: int = 32


class FcmProvider:
    """Sends Android and web pushes (and FCM-registered iOS ones) via FCM HTTP v1."""

    name = "fcm"
    recovery = NEITHER  # the collapse key is the backstop

    def __init__(self, settings: FcmSettings) -> None:
        self.settings = settings
        self.answer_seconds = settings.timeout_seconds + MIN_CONNECT_SECONDS
        credentials = settings.credentials
        if isinstance(credentials, str | Path):
            # google-auth leaves this classmethod unannotated
            credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                str(credentials), scopes=[MESSAGING_SCOPE]
            )
        self._adapter = HTTPAdapter(
            max_retries=Retry(total=0, read=False, respect_retry_after_header=False),
            pool_connections=1,
            pool_maxsize=settings.max_workers,
        )
        self._fcm = FCMNotification(
            credentials=credentials, project_id=settings.project_id, adapter=self._adapter
        )
        self._fcm.FCM_END_POINT_BASE = settings.base_url.rstrip("/") + "/v1/projects"
        self.token = FcmAccessToken(credentials, provider=self.name)
        self._sessions = threading.local()
        self._executor = ThreadPoolExecutor(settings.max_workers, thread_name_prefix="fcm-send")
        self._closed = False

    @property
    def max_in_flight(self) -> int:
        return self.settings.max_workers

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        if self._closed:
            raise TransientProviderError("ProviderClosed", provider=self.name)
        answer_by = float("inf") if deadline is None else deadline
        if time.monotonic() > answer_by - self.answer_seconds:
            raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)
        payload = self._payload(push, ids)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._post, payload, answer_by)

    async def aclose(self) -> None:
        """Stop taking sends, wait for the ones in flight (each bounded by its timeout)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        self._adapter.close()

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

    def _post(self, payload: bytes, answer_by: float) -> ProviderReceipt:
        """One POST, in a worker thread, unless it is too late to start. Nothing retries."""
        authorization = self.token.header()  # the shared token, fetched when due
        try:
            url = self._fcm.fcm_end_point
        except FCMError as exc:
            raise ProviderConfigurationError("NoProjectId", provider=self.name) from exc
        s = self.settings
        # Connecting may take what the read timeout leaves before the deadline.
        connect = min(s.connect_timeout_seconds, answer_by - time.monotonic() - s.timeout_seconds)
        if connect < MIN_CONNECT_SECONDS:  # waited in the pool's queue too long
            raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)
        timeout = (connect, s.timeout_seconds)
        headers = {"Content-Type": "application/json", "Authorization": authorization}
        try:
            response = self._session().post(url, data=payload, headers=headers, timeout=timeout)
        except requests.ConnectTimeout as exc:
            raise TransientProviderError("ConnectTimeout", provider=self.name) from exc
        except requests.ReadTimeout as exc:
            raise UnknownOutcomeError("Timeout", provider=self.name) from exc
        except requests.ConnectionError as exc:
            if _never_connected(exc):
                raise TransientProviderError("ConnectFailed", provider=self.name) from exc
            raise UnknownOutcomeError("ConnectionLost", provider=self.name) from exc
        except requests.RequestException as exc:
            raise UnknownOutcomeError(type(exc).__name__, provider=self.name) from exc
        if response.status_code == 401:
            self.token.refused(authorization)  # fetch a fresh token on the next send
        return self._receipt(response)

    def _session(self) -> requests.Session:
        """This thread's session; all share the adapter (its pool) and send no retries."""
        session: requests.Session | None = getattr(self._sessions, "session", None)
        if session is None:
            session = self._sessions.session = requests.Session()
            session.mount("http://", self._adapter)
            session.mount("https://", self._adapter)
        return session

    def _receipt(self, response: requests.Response) -> ProviderReceipt:
        status = response.status_code
        error = _error(response)
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
            retry_after = retry_after_seconds(response.headers.get("Retry-After"))
            raise TransientProviderError(
                code, status=status, provider=self.name, retry_after=retry_after
            )
        raise PermanentProviderError(code, status=status, provider=self.name)


def _error(response: requests.Response) -> dict[str, str]:
    """The message name of a 200, or the FCM error code / status of an error, as strings."""
    try:
        body = json.loads(response.content or b"{}")
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


def _never_connected(exc: requests.ConnectionError) -> bool:
    """True when the connection failed before the request could be written."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, NewConnectionError | ConnectTimeoutError | ConnectionRefusedError):
            return True
        reason = getattr(cause, "reason", None)
        cause = reason if isinstance(reason, BaseException) else cause.__context__
    return False
