"""FCM's OAuth access token: one per credential, shared by every send, fetched off the loop.

pyfcm keeps a token per thread and re-fetches it every 30 minutes per thread,
so 32 threads fetch 32 tokens. Here one `FcmAccessToken` fetches a token when
there is none or it is within google-auth's refresh threshold of its expiry
(a few minutes), and every send carries it; google-auth is asked at most once
every CHECK_SECONDS (its clock read was 2% of a fan-out worker's CPU when
asked on every send). google-auth's refresh is
blocking (it POSTs through requests), so it runs in a thread, one at a time:
the sends that find the token due meanwhile wait for that one refresh, and a
send cancelled while it runs does not cancel it.

A refused refresh (google-auth's RefreshError: a revoked key, a wrong
account) is ours to fix, not the push's: `ProviderConfigurationError`. A
token service out of reach is transient.
"""

from __future__ import annotations

import asyncio
import time

from google.auth.credentials import Credentials
from google.auth.exceptions import RefreshError, TransportError
from google.auth.transport.requests import Request

from providers.errors import ProviderConfigurationError, TransientProviderError

# How long a token google-auth called valid is used without asking again: nothing
# next to its refresh threshold (3 min 45 s before expiry).
CHECK_SECONDS = 1.0


class FcmAccessToken:
    """The `Authorization` header every FCM request carries, fetched once per lifetime."""

    def __init__(self, credentials: Credentials, *, provider: str = "fcm") -> None:
        self._credentials = credentials
        self._provider = provider
        self._request = Request()
        # None while there is no token, or a refresh is writing the credentials: no
        # send reads them then (the refresh's thread is their only writer).
        self._header: str | None = None
        self._refresh: asyncio.Task[str] | None = None
        self._checked_at = float("-inf")  # when google-auth last called the token valid
        self.fetched = 0  # tokens fetched so far

    async def header(self) -> str:
        """`Bearer <token>`, fetching a new token only when there is none or it is due."""
        header = self._header
        if header is not None:
            now = time.monotonic()
            if now - self._checked_at < CHECK_SECONDS:
                return header
            if self._credentials.valid:
                self._checked_at = now
                return header
        if self._refresh is None:
            self._header = None
            self._refresh = asyncio.create_task(self._fetch())
            self._refresh.add_done_callback(_retrieve)
        return await asyncio.shield(self._refresh)

    def refused(self, header: str) -> None:
        """FCM answered 401 to `header`: fetch a new token next time, unless one came since."""
        if header == self._header:
            self._header = None

    async def _fetch(self) -> str:
        try:
            await asyncio.to_thread(self._refresh_credentials)
        finally:
            self._refresh = None
        self.fetched += 1
        self._header = f"Bearer {self._credentials.token}"
        return self._header

    def _refresh_credentials(self) -> None:
        """In a thread: google-auth's blocking refresh, its errors translated."""
        try:
            self._credentials.refresh(self._request)  # type: ignore[no-untyped-call]
        except RefreshError as exc:
            raise ProviderConfigurationError("AccessTokenRefused", provider=self._provider) from exc
        except TransportError as exc:
            raise TransientProviderError("AccessTokenUnavailable", provider=self._provider) from exc


def _retrieve(task: asyncio.Task[str]) -> None:
    """A refresh whose every waiter was cancelled still has its error read (not logged)."""
    if not task.cancelled():
        task.exception()
