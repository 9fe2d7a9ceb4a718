"""A webhook receiver for tests and demos: real HTTP (uvicorn), every delivery verified.

```python
async with WebhookReceiver() as receiver:
    receiver.trust("/orders", secret)              # verify what arrives there with it
    receiver.script("/gone", ReceiverReply(status=410))
    ...
    assert receiver.counts()[webhook_id] == 1
```

Each delivery is verified on arrival by the `standardwebhooks` package, as a
receiver of ours would (`Webhook(secret).verify(body, headers)`), once per secret
trusted for its path: `verified_with` lists the secrets that verified it. One that
no trusted secret verifies is answered 401 (and listed in `rejected`). Deliveries
are recorded before they are answered, with their webhook-id, timestamp, body and
arrival time, so a delivery whose sender died before the answer counts too.

How a path answers is scripted (`ReceiverReply`): a status with a Retry-After,
after a latency, or held: accepted and not answered until `release()` (or the
receiver closes), which is silence to the sender, or a request on the wire when
its worker is SIGKILLed. It runs in the caller's event loop.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

import uvicorn
from standardwebhooks import Webhook, WebhookVerificationError

START_SECONDS = 10.0  # uvicorn's start and stop, at most


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiverReply:
    """How a path answers: `status` (with `retry_after` as the Retry-After header) after
    `latency` seconds; `hold`: only once `release()` is called (silence until then)."""

    status: int = 204
    retry_after: str | None = None
    latency: float = 0.0
    hold: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceivedWebhook:
    """One delivery as it arrived, and which trusted secrets verified it."""

    path: str
    webhook_id: str
    timestamp: str
    signature: str
    body: bytes
    headers: Mapping[str, str]
    verified_with: tuple[str, ...]
    received_at: float  # time.monotonic()

    @property
    def verified(self) -> bool:
        return bool(self.verified_with)


@dataclass(slots=True)
class _Script:
    reply: ReceiverReply
    remaining: int | None


class WebhookReceiver:
    """Receives webhooks on 127.0.0.1 (see the module docstring)."""

    def __init__(self) -> None:
        self.deliveries: list[ReceivedWebhook] = []
        self.unscripted = ReceiverReply()
        self._trusted: dict[str, tuple[str, ...]] = {}
        self._scripts: dict[str, _Script] = {}
        self._release = asyncio.Event()
        self._holding = 0
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._socket = sock
        config = uvicorn.Config(
            self._app,
            interface="asgi3",
            lifespan="off",
            ws="none",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        async with asyncio.timeout(START_SECONDS):
            while not self._server.started:
                if self._task.done():
                    self._task.result()  # a failed start raises here
                await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            async with asyncio.timeout(START_SECONDS):
                await self._task
        if self._socket is not None:
            self._socket.close()

    @property
    def port(self) -> int:
        assert self._socket is not None, "use WebhookReceiver as an async context manager"
        port: int = self._socket.getsockname()[1]
        return port

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def trust(self, path: str, *secrets: str) -> None:
        """Verify the deliveries to `path` with these `whsec_` secrets (each on its own)."""
        self._trusted[path] = secrets

    def script(self, path: str, reply: ReceiverReply, *, times: int | None = None) -> None:
        """Answer `path`'s next `times` deliveries (all, if None) with `reply`, then as
        `unscripted`; replaces the path's previous script."""
        self._scripts[path] = _Script(reply=reply, remaining=times)

    def release(self) -> None:
        """Answer every delivery held now (later ones are held until the next release)."""
        released, self._release = self._release, asyncio.Event()
        released.set()

    @property
    def holding(self) -> int:
        """Deliveries held right now, unanswered."""
        return self._holding

    def for_path(self, path: str) -> list[ReceivedWebhook]:
        return [d for d in self.deliveries if d.path == path]

    def counts(self) -> Counter[str]:
        """Deliveries by webhook-id: more than 1 is a duplicate the receiver must dedupe."""
        return Counter(d.webhook_id for d in self.deliveries)

    @property
    def rejected(self) -> list[ReceivedWebhook]:
        """Deliveries no trusted secret verified (answered 401)."""
        return [d for d in self.deliveries if not d.verified]

    def _reply_for(self, path: str) -> ReceiverReply:
        script = self._scripts.get(path)
        if script is None:
            return self.unscripted
        if script.remaining is None:
            return script.reply
        if script.remaining > 0:
            script.remaining -= 1
            return script.reply
        del self._scripts[path]
        return self.unscripted

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI app: read, verify, record, then answer as scripted."""
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"]
        verified = tuple(
            secret for secret in self._trusted.get(path, ()) if _verifies(secret, body, headers)
        )
        self.deliveries.append(
            ReceivedWebhook(
                path=path,
                webhook_id=headers.get("webhook-id", ""),
                timestamp=headers.get("webhook-timestamp", ""),
                signature=headers.get("webhook-signature", ""),
                body=bytes(body),
                headers=headers,
                verified_with=verified,
                received_at=time.monotonic(),
            )
        )
        reply = self._reply_for(path) if verified else ReceiverReply(status=401)
        if reply.latency:
            await asyncio.sleep(reply.latency)
        if reply.hold:
            self._holding += 1
            try:
                await self._release.wait()
            finally:
                self._holding -= 1
        answer_headers = [(b"content-length", b"0")]
        if reply.retry_after is not None:
            answer_headers.append((b"retry-after", reply.retry_after.encode()))
        await send(
            {"type": "http.response.start", "status": reply.status, "headers": answer_headers}
        )
        await send({"type": "http.response.body", "body": b""})


def _verifies(secret: str, body: bytearray, headers: dict[str, str]) -> bool:
    try:
        Webhook(secret).verify(bytes(body), headers)
    except (WebhookVerificationError, ValueError):  # ValueError: a body that is not JSON
        return False
    return True
