"""Webhook endpoints as the worker and the operator's commands use them: the key that
keeps their signing secrets encrypted at rest, the rule for their URLs, and the
worker's reads of what a call needs (`SigningReads`).

The key: IW_WEBHOOK_SECRETS_KEY, Fernet keys (`cryptography`), comma-separated;
the first encrypts, every one decrypts (`MultiFernet`), so a new key is put first
and an old one kept until nothing it encrypted is left. Make one with:

    python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"

Without a key a worker with a webhook queue, and the commands that make a secret,
refuse to start (`ConfigurationError`): a secret is never stored in the clear.

The URL: https, or http to a host of IW_WEBHOOK_ALLOW_HTTP_HOSTS (tests and demos
on 127.0.0.1); no fragment, no user or password in it. Checked when an endpoint
is added and again before every call (the setting may have changed since).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

import asyncpg

from consumers.message.decisions import ConfigurationError
from dedupe import SecretBox, SigningEndpoint, WebhookEndpoints
from providers import TransientProviderError

MAX_URL_CHARS = 2048
KEY_VARIABLE = "IW_WEBHOOK_SECRETS_KEY"
CACHE_ENTRIES = 4096  # endpoints remembered at once, past which expired ones are dropped


def secret_box(keys: Sequence[str]) -> SecretBox:
    """The `MultiFernet` of these keys; `ConfigurationError` (never quoting a key) if
    there is none or one is not a Fernet key."""
    if not keys:
        raise ConfigurationError(
            f"{KEY_VARIABLE} is not set: webhook signing secrets are kept encrypted under it"
            " (Fernet keys, comma-separated; see consumers.jobs.webhook_endpoints)"
        )
    try:  # the push and webhooks extras bring cryptography
        from cryptography.fernet import Fernet, MultiFernet
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            "webhooks need the webhooks extra: pip install 'idempotent-workers[webhooks]'"
        ) from exc
    fernets = []
    for n, key in enumerate(keys, start=1):
        try:
            fernets.append(Fernet(key))
        except ValueError:
            raise ConfigurationError(
                f"{KEY_VARIABLE}: key {n} of {len(keys)} is not a Fernet key"
                " (32 bytes, URL-safe base64)"
            ) from None
    return MultiFernet(fernets)


def url_problem(url: str, allow_http_hosts: frozenset[str]) -> str | None:
    """Why `url` cannot be a webhook endpoint's, or None."""
    if len(url) > MAX_URL_CHARS:
        return f"at most {MAX_URL_CHARS} characters"
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return "not a URL"
    if not host:
        return "no host"
    if parts.username is not None or parts.password is not None:
        return "no user or password in the URL (it is shown by `webhook endpoint list`)"
    if parts.fragment:
        return "no fragment"
    if parts.scheme == "https":
        return None
    if parts.scheme == "http" and host in allow_http_hosts:
        return None
    if parts.scheme == "http":
        return f"https only: http to {host} is not in IW_WEBHOOK_ALLOW_HTTP_HOSTS"
    return "https only"


class SigningReads:
    """An endpoint's URL and live secrets, decrypted, as a call needs them when it can
    start: read at most once at a time per endpoint, and kept `cache_seconds`, so a
    burst of calls to one endpoint reads it once. A failed read is not kept."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        store: WebhookEndpoints,
        box: SecretBox,
        *,
        cache_seconds: float,
    ) -> None:
        self._pool = pool
        self._store = store
        self._box = box
        self._seconds = cache_seconds
        self._cache: dict[str, tuple[float, asyncio.Future[SigningEndpoint | None]]] = {}

    async def read(self, endpoint_id: str) -> SigningEndpoint | None:
        """The endpoint (None: removed); `TransientProviderError` if its secret cannot
        be decrypted with the keys given (a key dropped too soon)."""
        now = time.monotonic()
        cached = self._cache.get(endpoint_id)
        if cached is not None and cached[0] > now:
            return await asyncio.shield(cached[1])
        if len(self._cache) >= CACHE_ENTRIES:
            for stale in [k for k, (until, _) in self._cache.items() if until <= now]:
                del self._cache[stale]
        reading = asyncio.ensure_future(self._read(endpoint_id))
        self._cache[endpoint_id] = (now + self._seconds, reading)
        try:
            return await asyncio.shield(reading)
        except Exception:
            if self._cache.get(endpoint_id, (0.0, None))[1] is reading:
                del self._cache[endpoint_id]
            raise

    def forget(self, endpoint_id: str) -> None:
        """Read the endpoint again next time (it was just disabled)."""
        self._cache.pop(endpoint_id, None)

    async def _read(self, endpoint_id: str) -> SigningEndpoint | None:
        from cryptography.fernet import InvalidToken  # present: the box is built with it

        async with self._pool.acquire() as conn:
            try:
                return await self._store.signing(conn, endpoint_id, self._box)
            except InvalidToken:
                raise TransientProviderError(
                    f"secret_undecryptable: no key of {KEY_VARIABLE} decrypts"
                    f" a secret of {endpoint_id}",
                    provider="webhook",
                ) from None
