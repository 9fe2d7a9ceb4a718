"""What goes on the APNs wire for one push, and what its answer means.

Answers map to the error tree (see `providers.errors`):
200 -> receipt (the answered apns-id); 400 BadDeviceToken / DeviceTokenNotForTopic,
410 Unregistered / ExpiredToken -> InvalidDeviceToken; our credentials or
configuration refused (403 InvalidProviderToken / ExpiredProviderToken /
MissingProviderToken / BadCertificate..., 400 BadTopic / TopicDisallowed /
MissingTopic) -> ProviderConfigurationError: no push is at fault; 429, 5xx and
TooManyProviderTokenUpdates -> transient, Retry-After honoured; any other 4xx ->
permanent. A stream that ended unprocessed (refused, above a GOAWAY's last stream
id) is transient; one that may have been processed is an unknown outcome.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from providers.errors import (
    InvalidDeviceToken,
    PermanentProviderError,
    ProviderConfigurationError,
    TransientProviderError,
    UnknownOutcomeError,
    retry_after_seconds,
)
from providers.ids import SendIds
from providers.provider import ProviderReceipt
from providers.push import Priority, Push

INVALID_TOKEN_REASONS = frozenset(
    {"BadDeviceToken", "DeviceTokenNotForTopic", "Unregistered", "ExpiredToken"}
)
CONFIGURATION_REASONS = frozenset(
    {
        "InvalidProviderToken",
        "ExpiredProviderToken",
        "MissingProviderToken",
        "BadCertificate",
        "BadCertificateEnvironment",
        "BadTopic",
        "TopicDisallowed",
        "MissingTopic",
        "Forbidden",
    }
)
TRANSIENT_REASONS = frozenset({"TooManyProviderTokenUpdates", "TooManyRequests", "Shutdown"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """APNs answered this stream: its status, headers and whole body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Lost:
    """The stream ended without an answer; `processed=False` only when APNs said so (GOAWAY)."""

    reason: str
    processed: bool = True


Outcome = Answer | Lost


@dataclass(slots=True)
class PendingStream:
    """A request on the wire: its answer to come, and the answer's parts as they arrive.

    `deadline` (the loop's clock): when its send stops waiting for the answer;
    `waiter`: the send's wait, woken by the answer or the deadline, whichever
    comes first (cancelled with the send, it leaves `answer` alone)."""

    answer: asyncio.Future[Outcome]
    deadline: float
    waiter: asyncio.Future[None] | None = None
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)


class AnswerWaits:
    """Sends waiting for their streams' answers, each woken by its answer or by its
    deadline, whichever comes first; one timer for them all, at the earliest deadline
    waited on.

    The answer wakes its send directly, with no callback in between, and no
    timer is made and cancelled per request: `python -m proving.bench.waits`
    (2,000 in flight) gave 11.5 us a wait against 19.7 with a future and a timer
    per wait and 31.1 with `asyncio.wait`, an `await` with no deadline 12.2
    (medians of 5, 2026-12-06 21:14 UTC, a slow hour of the 2-core python-svc).
    With one timeout for every send of a provider the earliest deadline is the
    oldest stream's: the timer fires about once a timeout, and then looks at
    every stream once.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        streams: Callable[[], Iterable[PendingStream]],
    ) -> None:
        self._loop = loop
        self._streams = streams  # the connection's streams not answered yet
        self._timer: asyncio.TimerHandle | None = None

    async def wait(self, stream: PendingStream) -> bool:
        """Until `stream`'s answer or its deadline; whether the answer came.

        Cancelled, the wait leaves the stream alone: it stays on its connection,
        its answer pending (what `ApnsProvider.aclose` waits for), until APNs answers."""
        if not stream.answer.done():
            stream.waiter = self._loop.create_future()
            if self._timer is None:
                self._timer = self._loop.call_at(stream.deadline, self._expire)
            elif stream.deadline < self._timer.when():
                self._timer.cancel()
                self._timer = self._loop.call_at(stream.deadline, self._expire)
            await stream.waiter  # cancelling the send cancels this, not `answer`
        return stream.answer.done()

    def answered(self, stream: PendingStream) -> None:
        """`stream`'s answer is set: its send stops waiting."""
        if stream.waiter is not None and not stream.waiter.done():
            stream.waiter.set_result(None)

    def close(self) -> None:
        """No stream is left to wait on (the connection is lost: each was finished)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        """Wake the sends whose deadline passed with no answer; watch the next deadline."""
        self._timer = None
        now, following = self._loop.time(), math.inf
        for stream in self._streams():
            if stream.waiter is None or stream.waiter.done():
                continue  # not waited on yet, or no more
            if stream.deadline <= now:
                stream.waiter.set_result(None)
            else:
                following = min(following, stream.deadline)
        if following < math.inf:
            self._timer = self._loop.call_at(following, self._expire)


class NotSentError(Exception):
    """The request was not written (no stream, connection gone): nothing reached APNs."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def apns_request(
    push: Push, ids: SendIds, *, host: str, topic: str, body: bytes | None = None
) -> tuple[list[tuple[str, str]], bytes]:
    """The HTTP/2 request headers and JSON body of one push (`body`, if already encoded)."""
    push_type = push.effective_push_type
    headers = [
        (":method", "POST"),
        (":scheme", "https"),
        (":path", f"/3/device/{push.target.token}"),
        ("host", host),
        ("apns-id", ids.effect_id),
        ("apns-topic", topic),
        ("apns-push-type", push_type),
        ("apns-collapse-id", ids.collapse_id),
    ]
    priority = push.priority or (Priority.NORMAL if push_type == "background" else None)
    if priority is not None:
        headers.append(("apns-priority", "10" if priority is Priority.HIGH else "5"))
    if push.ttl_seconds is not None:
        expiration = 0 if push.ttl_seconds <= 0 else int(time.time()) + push.ttl_seconds
        headers.append(("apns-expiration", str(expiration)))
    return headers, body if body is not None else apns_body(push)


# The largest body APNs takes: 4 KB, 5 KB for VoIP ("Sending notification
# requests to APNs"); past it APNs answers 413 PayloadTooLarge.
MAX_PAYLOAD_BYTES = 4096
MAX_VOIP_PAYLOAD_BYTES = 5120
PAYLOAD_TOO_LARGE = "PayloadTooLarge"


def payload_limit(push_type: str) -> int:
    """The largest body APNs takes for a push of `push_type`."""
    return MAX_VOIP_PAYLOAD_BYTES if push_type == "voip" else MAX_PAYLOAD_BYTES


def apns_body(push: Push) -> bytes:
    """The request's JSON body: compact, in UTF-8 (APNs counts its limit in bytes).

    Rendered by orjson (a one-device job encodes its own on every send: 0.14 us
    against 2.8 for `json.dumps`); what orjson refuses (an int past 64 bits in
    the app's data) by the standard library, in the same form."""
    payload = apns_payload(push)
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


class LastBody:
    """The JSON body of the last push, reused while the pushes share its notification
    object: the targets of one job do, so a fan-out job encodes its payload once."""

    def __init__(self) -> None:
        self._notification: object = None
        self._push_type = ""
        self._body = b""

    def of(self, push: Push) -> bytes:
        push_type = push.effective_push_type
        if push.notification is not self._notification or push_type != self._push_type:
            self._body = apns_body(push)
            self._notification, self._push_type = push.notification, push_type
        return self._body


def apns_payload(push: Push) -> dict[str, Any]:
    """The JSON payload: the `aps` dictionary plus the app's data as top-level keys."""
    note = push.notification
    aps: dict[str, Any] = {}
    alert = {k: v for k, v in (("title", note.title), ("body", note.body)) if v is not None}
    if alert:
        aps["alert"] = alert
    if push.effective_push_type == "background":
        aps["content-available"] = 1
    return {**note.data, "aps": aps}


def apns_result(outcome: Outcome, *, sent_apns_id: str, provider: str) -> ProviderReceipt:
    """The receipt of an accepted push (the answered apns-id); raises the error otherwise."""
    if isinstance(outcome, Lost):
        if outcome.processed:
            raise UnknownOutcomeError(outcome.reason, provider=provider)
        raise TransientProviderError(outcome.reason, provider=provider)
    status = outcome.status
    if status == 200:
        return ProviderReceipt(
            provider=provider, provider_message_id=outcome.headers.get("apns-id", sent_apns_id)
        )
    reason = reason_of(outcome.body) or f"HTTP{status}"
    if reason in INVALID_TOKEN_REASONS or status == 410:
        raise InvalidDeviceToken(reason, status=status, provider=provider)
    if reason in CONFIGURATION_REASONS:
        raise ProviderConfigurationError(reason, status=status, provider=provider)
    if status == 429 or status >= 500 or reason in TRANSIENT_REASONS:
        retry_after = retry_after_seconds(outcome.headers.get("retry-after"))
        raise TransientProviderError(
            reason, status=status, provider=provider, retry_after=retry_after
        )
    raise PermanentProviderError(reason, status=status, provider=provider)


def reason_of(body: bytes) -> str | None:
    """APNs' `reason` of an error answer's JSON body, if it has one."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return None
    reason = decoded.get("reason") if isinstance(decoded, dict) else None
    return reason if isinstance(reason, str) else None
