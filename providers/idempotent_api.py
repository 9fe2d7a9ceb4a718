"""Any HTTP API that takes an idempotency key: a base a user subclasses in a few lines.

```python
class PaymentsApi(IdempotentApi):
    name = "payments"
    base_url = "https://payments.example.com"
    recovery = replays_within(24 * 3600)  # as long as the provider keeps a key

    def request(self, call: ApiCall) -> ApiRequest:
        return ApiRequest(method="POST", path="/v1/charges", form=dict(call.body))
```

Every call carries `ids.effect_id` in the `key_header` (default `Idempotency-Key`):
stable per job and target, the same on every attempt and after a crash. What the
channel offers after a crash is the subclass's `recovery`:

- `replays_within(seconds)`: the provider answers a call with a key it has seen
  with the first call's answer (Stripe, Adyen): the ledger calls again with the
  same key, only while the call lands inside that window;
- `LOOKUP_BY_KEY`: the provider can be asked whether a call with our key arrived;
  give `lookup_request(call, key)` (and, if its answer is not a list of objects
  under `data` or one object with an `id`, `found`): the ledger asks first and
  calls only if it never arrived;
- `NEITHER`: the queue's resend/skip policy, and the key is the provider's to honour.

What an answer means (`refusal` gives it; override it for another API's habits):

- 2xx: sent; `provider_id` reads the provider's id (default: the body's `id`, else
  the key itself);
- 409: a call with this key is still in progress there: transient, retried after
  its Retry-After or `in_progress_retry_seconds`;
- 429, 5xx: transient, after its Retry-After;
- 401, 403: `ProviderConfigurationError`, the channel pauses;
- an answer saying the key was used with other parameters (`key_reused`): permanent,
  `idempotency_key_reused` (our request for one key changed: `request` must be
  deterministic);
- 410: `TargetGone`; any other 4xx, 400 and 422 included: permanent;
- no connection, or none free in time: transient (nothing was sent); a timeout or a
  lost connection once the request may have been written: `UnknownOutcomeError`.

One call is one request: httpx is given no retries, and a redirect is not followed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import httpx

from providers.api_call import ApiCall, ApiRequest, ApiResponse, ApiSettings
from providers.errors import (
    NotStartedInTime,
    PermanentProviderError,
    ProviderConfigurationError,
    ProviderError,
    TargetGone,
    TransientProviderError,
    UnknownOutcomeError,
    retry_after_seconds,
)
from providers.ids import SendIds
from providers.provider import ProviderReceipt, Recovery, RecoveryKind

_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_MISCONFIGURED = (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError)


class IdempotentApi:
    """A `Sender[ApiCall]` for one HTTP API (see the module docstring).

    A subclass gives `name`, `recovery`, `request()`, and usually `base_url`; the
    rest has defaults. `address_field`: the body's field that names what a call
    acts on (a customer, an order), shown as the ledger row's address; None: the
    API's name. `validate(body)` refuses a job body before anything is recorded,
    at the send API's door and in the worker alike: raise `InvalidCall`.
    """

    # Set on the class (a Sender's `name` and `recovery` are attributes to its callers).
    name: str
    recovery: Recovery
    base_url: str = ""
    key_header: str = "Idempotency-Key"
    address_field: str | None = None
    in_progress_retry_seconds: float = 1.0

    def __init__(
        self,
        settings: ApiSettings | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        cls = type(self)
        for needed in ("name", "recovery"):
            if not hasattr(cls, needed):
                raise TypeError(f"{cls.__name__} must set `{needed}` (see IdempotentApi)")
        if cls.request is IdempotentApi.request:
            raise TypeError(f"{cls.__name__} must define request(call)")
        lookup = cls.lookup_request is not IdempotentApi.lookup_request
        if cls.recovery.kind is RecoveryKind.LOOKUP_BY_KEY and not lookup:
            raise TypeError(f"{cls.__name__} offers LOOKUP_BY_KEY: define lookup_request()")
        self.settings = settings = settings or ApiSettings()
        base_url = settings.base_url or cls.base_url
        if not base_url:
            raise TypeError(f"{cls.__name__}: no base_url (on the class or in its ApiSettings)")
        self.answer_seconds = settings.timeout_seconds + settings.connect_timeout_seconds
        self._client = httpx.AsyncClient(
            base_url=base_url,
            headers=dict(settings.headers),
            timeout=httpx.Timeout(
                settings.timeout_seconds,
                connect=settings.connect_timeout_seconds,
                pool=settings.connect_timeout_seconds,
            ),
            limits=httpx.Limits(
                max_connections=settings.max_in_flight,
                max_keepalive_connections=settings.max_in_flight,
            ),
            follow_redirects=False,
            transport=transport,
        )
        self._closed = False

    # -- what a subclass gives ---------------------------------------------

    @classmethod
    def validate(cls, body: Mapping[str, Any]) -> None:
        """Refuse a body this API cannot take: raise `InvalidCall("field: what is wrong")`."""

    def request(self, call: ApiCall) -> ApiRequest:
        """The request that makes `call` (the same for the same call, every time)."""
        raise NotImplementedError

    def lookup_request(self, call: ApiCall, key: str) -> ApiRequest | None:
        """The request that asks whether a call with idempotency key `key` arrived."""
        return None

    def provider_id(self, call: ApiCall, answer: ApiResponse) -> str | None:
        """The provider's id of what a 2xx made (None: the key stands for it)."""
        body = answer.json()
        found = body.get("id") if isinstance(body, dict) else None
        return found if isinstance(found, str) and found else None

    def found(self, call: ApiCall, answer: ApiResponse) -> str | None:
        """The provider's id of the call a 2xx lookup found; None: it never arrived."""
        body = answer.json()
        if isinstance(body, dict) and isinstance(body.get("data"), list):
            items = [item for item in body["data"] if isinstance(item, dict)]
            body = items[0] if items else None
        found = body.get("id") if isinstance(body, dict) else None
        return str(found) if found else None

    def key_reused(self, answer: ApiResponse) -> bool:
        """Whether a refusal says the key was first used with other parameters
        (Stripe: 400 `idempotency_error`; the IETF draft: 422)."""
        if answer.status not in (400, 422):
            return False
        body = answer.json()
        error = body.get("error", body) if isinstance(body, dict) else None
        if not isinstance(error, dict):
            return False
        said = " ".join(str(error.get(k, "")) for k in ("type", "code", "title"))
        return "idempotency" in said.lower() or "idempotent" in said.lower()

    def refusal(self, call: ApiCall, answer: ApiResponse) -> ProviderError:
        """What a non-2xx answer means (the module docstring's table)."""
        status, name = answer.status, self.name
        code = _error_code(answer)
        retry_after = retry_after_seconds(answer.headers.get("retry-after"))
        if status == 409:
            wait = retry_after if retry_after is not None else self.in_progress_retry_seconds
            return TransientProviderError(
                f"KeyInProgress {code}", status=status, provider=name, retry_after=wait
            )
        if status == 429 or status >= 500:
            return TransientProviderError(
                code, status=status, provider=name, retry_after=retry_after
            )
        if status in (401, 403):
            return ProviderConfigurationError(code, status=status, provider=name)
        if self.key_reused(answer):
            reason = "idempotency_key_reused: the call with this key had other parameters"
            return PermanentProviderError(reason, status=status, provider=name)
        if status == 410:
            return TargetGone(code, status=status, provider=name)
        return PermanentProviderError(code, status=status, provider=name)

    # -- the Sender ---------------------------------------------------------

    @property
    def max_in_flight(self) -> int:
        return self.settings.max_in_flight

    async def send(
        self, effect: ApiCall, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        """One request with the key `ids.effect_id`; what its answer means is `refusal`."""
        self._may_start(deadline)
        request = self.request(effect)
        key = ids.effect_id
        try:
            answer = await self._call(request, key)
        except _MISCONFIGURED as exc:
            raise ProviderConfigurationError(type(exc).__name__, provider=self.name) from exc
        except _NOT_SENT as exc:
            raise TransientProviderError(type(exc).__name__, provider=self.name) from exc
        except (httpx.HTTPError, TimeoutError) as exc:  # it may have been written: maybe made
            raise UnknownOutcomeError(type(exc).__name__, provider=self.name) from exc
        if 200 <= answer.status < 300:
            made = self.provider_id(effect, answer) or key
            return ProviderReceipt(provider=self.name, provider_message_id=made)
        raise self.refusal(effect, answer)

    async def look_up(
        self, effect: ApiCall, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt | None:
        """Ask whether the call with key `ids.effect_id` arrived: its receipt, or None.

        A lookup changes nothing: any failure to ask is transient."""
        self._may_start(deadline)
        request = self.lookup_request(effect, ids.effect_id)
        if request is None:
            raise ProviderConfigurationError("NoLookupRequest", provider=self.name)
        try:
            answer = await self._call(request, None)
        except _MISCONFIGURED as exc:
            raise ProviderConfigurationError(type(exc).__name__, provider=self.name) from exc
        except (httpx.HTTPError, TimeoutError) as exc:
            why = f"LookupFailed {type(exc).__name__}"
            raise TransientProviderError(why, provider=self.name) from exc
        if answer.status == 404:
            return None
        if 200 <= answer.status < 300:
            made = self.found(effect, answer)
            if made is None:
                return None
            return ProviderReceipt(provider=self.name, provider_message_id=made)
        raise self.refusal(effect, answer)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.aclose()

    def _may_start(self, deadline: float | None) -> None:
        if self._closed:
            raise TransientProviderError("SenderClosed", provider=self.name)
        if deadline is not None and time.monotonic() > deadline - self.answer_seconds:
            raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)

    async def _call(self, request: ApiRequest, key: str | None) -> ApiResponse:
        """One request, within `answer_seconds` in all (httpx's own timeouts are per
        operation: a server trickling its answer would outlast them)."""
        headers = dict(request.headers)
        if key is not None:
            headers[self.key_header] = key
        async with asyncio.timeout(self.answer_seconds):
            response = await self._client.request(
                request.method,
                request.path,
                json=request.json,
                data=request.form,
                params=request.params,
                headers=headers,
            )
        return ApiResponse(
            status=response.status_code,
            headers={k.lower(): v for k, v in response.headers.items()},
            content=response.content,
        )


def _error_code(answer: ApiResponse) -> str:
    """`HTTP<status>` and the API's error code or type, when its body names one."""
    body = answer.json()
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict):
        for key in ("code", "type"):
            value = error.get(key)
            if isinstance(value, str) and value and len(value) <= 100:
                return f"HTTP{answer.status} {value}"
    return f"HTTP{answer.status}"
