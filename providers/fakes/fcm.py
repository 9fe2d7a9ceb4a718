"""A local FCM: HTTP/1.1 on 127.0.0.1, the v1 send route and an OAuth token route.

```python
async with FakeFcm() as fcm:
    fcm.script("dead-token", status=404)
    provider = FcmProvider(fcm.settings())
```

It runs in the caller's event loop; FcmProvider reaches it over loopback, on as many
keep-alive connections as it has POSTs in flight.
`settings()` points at a service-account file whose RSA key is generated here and
whose token_uri is the fake's own OAuth route, so google-auth works unchanged.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from providers.fakes.ratelimit import FakeRateLimit
from providers.fcm import FcmSettings

ACCESS_TOKEN = "fake-fcm-access-token"
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
ERROR_CODES = {
    400: "INVALID_ARGUMENT",
    403: "SENDER_ID_MISMATCH",
    404: "UNREGISTERED",
    429: "QUOTA_EXCEEDED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class FcmReply:
    """How the fake answers: after `latency` seconds, `status` with FCM's `error_code`,
    or drop the connection (after reading the request, before answering). A 400's
    `field` is the offending field (`message.token` makes it a bad-token answer)."""

    status: int = 200
    error_code: str | None = None
    field: str = "message.token"
    latency: float = 0.0
    drop: bool = False
    retry_after: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FcmRequest:
    """One send request as the fake read it."""

    token: str
    collapse_key: str | None
    tag: str | None
    apns_collapse_id: str | None
    topic: str | None
    headers: Mapping[str, str]
    body: bytes
    received_at: float

    @property
    def message(self) -> Any:
        return json.loads(self.body)["message"]


@dataclass(slots=True)
class _Script:
    reply: FcmReply
    remaining: int | None


class FakeFcm:
    """A fake FCM server; `.requests` lists what it read, `.script()` sets its answers."""

    def __init__(self, *, project_id: str = "fake-project") -> None:
        self.project_id = project_id
        self.requests: list[FcmRequest] = []
        self.unscripted = FcmReply()  # the answer to a token with no script
        self.rate_limit: FakeRateLimit | None = None  # past it: 429 with Retry-After
        self.token_requests = 0  # OAuth token grants asked for
        self.token_lifetime = 3600  # seconds each granted access token is accepted
        self.refuse_tokens = False  # answer the OAuth route with 400 invalid_grant
        self.token_latency = 0.0  # seconds before the OAuth route answers
        self.refused_requests = 0  # sends answered 401: no token, or an expired one
        self._tokens: dict[str, float] = {}  # granted access token -> expiry (monotonic)
        self._scripts: dict[str, deque[_Script]] = {}
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._directory: tempfile.TemporaryDirectory[str] | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._directory = tempfile.TemporaryDirectory(prefix="fake-fcm-")
        self.service_account_file.write_text(json.dumps(self._service_account()))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        if self._server is not None:
            await self._server.wait_closed()
        if self._directory is not None:
            self._directory.cleanup()

    @property
    def port(self) -> int:
        assert self._server is not None, "use FakeFcm as an async context manager"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def service_account_file(self) -> Path:
        assert self._directory is not None, "use FakeFcm as an async context manager"
        return Path(self._directory.name) / "service-account.json"

    def settings(self, **overrides: Any) -> FcmSettings:
        values: dict[str, Any] = {
            "credentials": self.service_account_file,
            "project_id": self.project_id,
            "base_url": self.base_url,
        }
        return FcmSettings(**(values | overrides))

    def script(
        self,
        token: str,
        *,
        status: int = 200,
        error_code: str | None = None,
        field: str = "message.token",
        latency: float = 0.0,
        drop: bool = False,
        retry_after: int | None = None,
        times: int | None = None,
    ) -> None:
        """Answer `token`'s next `times` requests (all, if None) this way; scripts queue up."""
        code = error_code if error_code is not None else ERROR_CODES.get(status)
        reply = FcmReply(
            status=status,
            error_code=code,
            field=field,
            latency=latency,
            drop=drop,
            retry_after=retry_after,
        )
        self._scripts.setdefault(token, deque()).append(_Script(reply=reply, remaining=times))

    def requests_for(self, token: str) -> list[FcmRequest]:
        return [r for r in self.requests if r.token == token]

    def reply_for(self, token: str) -> FcmReply:
        limit = self.rate_limit
        if limit is not None and not limit.admit():  # past the quota: refused, whoever
            return FcmReply(status=429, error_code="QUOTA_EXCEEDED", retry_after=limit.retry_after)
        scripts = self._scripts.get(token)
        while scripts:
            script = scripts[0]
            if script.remaining is None:
                return script.reply
            if script.remaining > 0:
                script.remaining -= 1
                return script.reply
            scripts.popleft()
        return self.unscripted

    def _service_account(self) -> dict[str, str]:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return {
            "type": "service_account",
            "project_id": self.project_id,
            "private_key_id": "fake-key-id",
            "private_key": pem.decode(),
            "client_email": f"sender@{self.project_id}.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": f"{self.base_url}/token",
        }

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            while await self._exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # our own shutdown; asyncio's stream callback chokes on a cancelled handler
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; False when the connection is done."""
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *lines = head.decode("latin-1").split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = {}
        for line in lines:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if method == "POST" and path == "/token":
            self.token_requests += 1
            if self.token_latency > 0:
                await asyncio.sleep(self.token_latency)
            if self.refuse_tokens:
                refusal = {"error": "invalid_grant", "error_description": "Invalid JWT"}
                await _respond(writer, 400, refusal)
                return True
            token = f"{ACCESS_TOKEN}-{self.token_requests}"
            self._tokens[token] = time.monotonic() + self.token_lifetime
            grant = {"access_token": token, "expires_in": self.token_lifetime}
            await _respond(writer, 200, grant | {"token_type": "Bearer"})
            return True
        if method != "POST" or path != f"/v1/projects/{self.project_id}/messages:send":
            await _respond(writer, 404, _error_body(404, "NOT_FOUND", None, "no such route"))
            return True
        bearer = headers.get("authorization", "").removeprefix("Bearer ")
        if self._tokens.get(bearer, 0.0) < time.monotonic():  # unknown or expired
            self.refused_requests += 1
            await _respond(writer, 401, _error_body(401, None, None, "bad credentials"))
            return True
        message = json.loads(body)["message"]
        token = str(message.get("token", ""))
        android = message.get("android") or {}
        self.requests.append(
            FcmRequest(
                token=token,
                collapse_key=android.get("collapse_key"),
                tag=(android.get("notification") or {}).get("tag"),
                apns_collapse_id=((message.get("apns") or {}).get("headers") or {}).get(
                    "apns-collapse-id"
                ),
                topic=((message.get("webpush") or {}).get("headers") or {}).get("Topic"),
                headers=headers,
                body=body,
                received_at=time.monotonic(),
            )
        )
        reply = self.reply_for(token)
        if reply.latency > 0:
            await asyncio.sleep(reply.latency)
        if reply.drop:
            writer.transport.abort()
            return False
        extra = {"Retry-After": str(reply.retry_after)} if reply.retry_after is not None else {}
        if 300 <= reply.status < 400:  # a redirect to this same route
            extra["Location"] = f"/v1/projects/{self.project_id}/messages:send"
        if reply.status == 200:
            name = f"projects/{self.project_id}/messages/0:{len(self.requests)}%fake"
            await _respond(writer, 200, {"name": name}, extra)
        else:
            error = _error_body(reply.status, reply.error_code, reply.field, "scripted error")
            await _respond(writer, reply.status, error, extra)
        return True


def _error_body(status: int, code: str | None, field: str | None, message: str) -> Any:
    details: list[dict[str, Any]] = []
    if code is not None:
        details.append(
            {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}
        )
    if status == 400 and field is not None:
        violation = {"field": field, "description": "Invalid value"}
        details.append(
            {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [violation]}
        )
    error = {
        "code": status,
        "message": message,
        "status": STATUS_NAMES.get(status, "UNKNOWN"),
        "details": details,
    }
    return {"error": error}


async def _respond(
    writer: asyncio.StreamWriter, status: int, body: Any, extra: Mapping[str, str] | None = None
) -> None:
    payload = json.dumps(body).encode()
    lines = [
        f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}",
        "Content-Type: application/json; charset=UTF-8",
        f"Content-Length: {len(payload)}",
        *(f"{k}: {v}" for k, v in (extra or {}).items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
    await writer.drain()
