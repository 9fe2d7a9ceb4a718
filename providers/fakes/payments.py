"""A local payments API that keeps idempotency keys as Stripe documents (API v1).

```python
async with FakePayments() as payments:
    payments.script("cus_1", status=503, times=1)
    api = PaymentsApi(ApiSettings(base_url=payments.base_url))
    ...
    assert payments.created_by_key[key] == 1
```

A real HTTP server (uvicorn, and a Starlette app) in the caller's event loop, on
127.0.0.1. `POST /v1/charges` (form-encoded as Stripe takes it, or JSON) with an
`Idempotency-Key` header:

1. a key seen within `window_seconds` (24 hours by default) with the same
   parameters: the first answer again, status and body, with
   `Idempotent-Replayed: true`; no second charge;
2. the same key with other parameters: 400, `idempotency_error`;
3. the same key while its first request still runs: 409, `idempotency_error`;
4. a key older than the window is forgotten: the request makes a new charge (the
   danger a caller's own window must keep it from);
5. answers are kept once the endpoint ran, 500 included; a refusal before it (a
   parameter missing, 401, 429, 503) is not, and may be retried with the key.

`GET /v1/charges?idempotency_key=K` lists the charges made with key K. Stripe has
no such lookup; Svix (a message by its id) and Postmark (by metadata) have one:
this is the fake's form of it, for a `LOOKUP_BY_KEY` channel.

`created_by_key` counts the charges actually made per key, `requests` every
request read. `script(customer, ...)` answers that customer's next charges with a
status (429, 500, 503...), after a `latency` (the key in progress meanwhile),
holding the answer (`until`: the charge made, the answer sent once the event is
set) or never answering (`silent`: the charge made; the unknown outcome).
`advance(seconds)` moves the fake's clock, to reach a window's end at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import parse_qsl

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

WINDOW_SECONDS = 24 * 3600.0
NOT_KEPT = frozenset({401, 429, 503})  # refused before the endpoint ran: nothing to replay


@dataclass(frozen=True, slots=True, kw_only=True)
class PaymentsScript:
    """How the fake answers one charge request of a customer (see the module docstring)."""

    status: int = 200
    retry_after: float | None = None
    latency: float = 0.0
    until: asyncio.Event | None = None
    silent: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PaymentsRequest:
    """One request the fake read, and how it answered (0: never)."""

    method: str
    path: str
    key: str | None
    params: Mapping[str, str]
    received_at: float  # time.monotonic()
    status: int
    replayed: bool


@dataclass(slots=True)
class _Kept:
    params: Mapping[str, str]
    at: float  # the fake's clock
    status: int = 0  # 0: in progress
    body: Any = None


@dataclass(slots=True)
class _Queued:
    script: PaymentsScript
    remaining: int | None


class FakePayments:
    """The fake payments API (see the module docstring); use it as `async with`."""

    def __init__(self, *, window_seconds: float = WINDOW_SECONDS, api_key: str | None = None):
        self.window_seconds = window_seconds
        self.api_key = api_key  # None: any caller; else `Authorization: Bearer <api_key>`
        self.requests: list[PaymentsRequest] = []
        self.charges: dict[str, dict[str, Any]] = {}  # by charge id
        self.created_by_key: Counter[str] = Counter()
        self.offset = 0.0  # added to the wall clock: `advance()`
        self._keys: dict[str, _Kept] = {}
        self._scripts: dict[str, deque[_Queued]] = {}
        self._ids = itertools.count(1)
        self._closing = asyncio.Event()
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        app = Starlette(routes=[Route("/v1/charges", self._charges, methods=["GET", "POST"])])
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        async with asyncio.timeout(10):
            while not self._server.started:
                if self._task.done():
                    self._task.result()  # a failed start raises here
                await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing.set()  # every held answer ends
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await asyncio.shield(self._task)
            if not self._task.done():
                self._server.force_exit = True
                await self._task
        if self._socket is not None:
            self._socket.close()

    @property
    def base_url(self) -> str:
        assert self._socket is not None, "use FakePayments as an async context manager"
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def now(self) -> float:
        """The fake's clock: the wall clock, moved by `advance()`."""
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def script(
        self,
        customer: str,
        *,
        status: int = 200,
        retry_after: float | None = None,
        latency: float = 0.0,
        until: asyncio.Event | None = None,
        silent: bool = False,
        times: int | None = None,
    ) -> None:
        """Answer `customer`'s next `times` charge requests (all, if None) this way."""
        script = PaymentsScript(
            status=status, retry_after=retry_after, latency=latency, until=until, silent=silent
        )
        self._scripts.setdefault(customer, deque()).append(_Queued(script, times))

    def posts_with_key(self, key: str) -> list[PaymentsRequest]:
        return [r for r in self.requests if r.method == "POST" and r.key == key]

    def lookups(self) -> list[PaymentsRequest]:
        return [r for r in self.requests if r.method == "GET"]

    # -- the app -----------------------------------------------------------

    async def _charges(self, request: Request) -> Response:
        if request.method == "GET":
            key = request.query_params.get("idempotency_key")
            found = [c for c in self.charges.values() if key is not None and c["key"] == key]
            self._read(request, None, dict(request.query_params), 200)
            return JSONResponse({"object": "list", "data": [_public(c) for c in found]})
        params = await _params(request)
        key = request.headers.get("idempotency-key")
        bearer = request.headers.get("authorization", "")
        if self.api_key is not None and bearer != f"Bearer {self.api_key}":
            return self._answer(request, key, params, 401, _error("invalid_request_error"))
        kept = self._keys.get(key) if key is not None else None
        if kept is not None and self.now() - kept.at > self.window_seconds:
            del self._keys[key or ""]  # pruned: the key makes a new request (step 4)
            kept = None
        if kept is not None:
            if kept.params != params:
                message = "Keys for idempotent requests can only be used with the same parameters"
                return self._answer(request, key, params, 400, _error("idempotency_error", message))
            if kept.status == 0:
                message = "There is currently another in-progress request using this key"
                return self._answer(request, key, params, 409, _error("idempotency_error", message))
            return self._answer(request, key, params, kept.status, kept.body, replayed=True)
        missing = [name for name in ("amount", "currency", "customer") if not params.get(name)]
        if missing:
            body = _error("invalid_request_error", f"Missing required param: {missing[0]}.")
            return self._answer(request, key, params, 400, body)
        if key is not None:
            kept = self._keys[key] = _Kept(params=params, at=self.now())
        script = self._next_script(params["customer"])
        if script.latency > 0:
            await asyncio.sleep(script.latency)  # in progress: the same key now gets 409
        status, body = script.status, _error("api_error")
        if script.status == 200:
            body = self._charge(params, key)
        if kept is not None:
            if status in NOT_KEPT:
                self._keys.pop(key or "", None)
            else:
                kept.status, kept.body = status, body
        if script.silent or script.until is not None:
            self._read(request, key, params, 0)
            await self._hold(script)
            if script.silent:
                return Response(status_code=500)  # to a caller that gave up long ago
            return self._response(status, body, script.retry_after)
        return self._answer(request, key, params, status, body, retry_after=script.retry_after)

    def _charge(self, params: Mapping[str, str], key: str | None) -> dict[str, Any]:
        charge = {
            "id": f"ch_fake{next(self._ids):06d}",
            "object": "charge",
            "amount": int(params["amount"]) if params["amount"].isdigit() else params["amount"],
            "currency": params["currency"],
            "customer": params["customer"],
            "created": int(self.now()),
            "key": key,
        }
        self.charges[str(charge["id"])] = charge
        if key is not None:
            self.created_by_key[key] += 1
        return _public(charge)

    def _next_script(self, customer: str) -> PaymentsScript:
        scripts = self._scripts.get(customer)
        while scripts:
            queued = scripts[0]
            if queued.remaining is None:
                return queued.script
            if queued.remaining > 0:
                queued.remaining -= 1
                return queued.script
            scripts.popleft()
        return PaymentsScript()

    async def _hold(self, script: PaymentsScript) -> None:
        waits = [asyncio.ensure_future(self._closing.wait())]
        if script.until is not None and not script.silent:
            waits.append(asyncio.ensure_future(script.until.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()

    def _read(
        self,
        request: Request,
        key: str | None,
        params: Mapping[str, str],
        status: int,
        *,
        replayed: bool = False,
    ) -> None:
        self.requests.append(
            PaymentsRequest(
                method=request.method,
                path=request.url.path,
                key=key,
                params=params,
                received_at=time.monotonic(),
                status=status,
                replayed=replayed,
            )
        )

    def _answer(
        self,
        request: Request,
        key: str | None,
        params: Mapping[str, str],
        status: int,
        body: Any,
        *,
        replayed: bool = False,
        retry_after: float | None = None,
    ) -> Response:
        self._read(request, key, params, status, replayed=replayed)
        response = self._response(status, body, retry_after)
        if replayed:
            response.headers["Idempotent-Replayed"] = "true"
        return response

    def _response(self, status: int, body: Any, retry_after: float | None) -> Response:
        response = JSONResponse(body, status_code=status)
        if retry_after is not None:
            response.headers["Retry-After"] = f"{retry_after:g}"
        return response


async def _params(request: Request) -> dict[str, str]:
    """The request's parameters: a JSON object's (as strings) or a form's."""
    raw = await request.body()
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            value = json.loads(raw or b"{}")
        except ValueError:
            return {}
        if not isinstance(value, dict):
            return {}
        return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


def _error(kind: str, message: str = "") -> dict[str, Any]:
    return {"error": {"type": kind, "message": message or kind}}


def _public(charge: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in charge.items() if k != "key"}
