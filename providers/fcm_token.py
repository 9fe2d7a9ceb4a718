"""FCM's OAuth access token: one per credential, shared by every sending thread.

pyfcm keeps a token per thread and re-fetches it every 30 minutes per thread,
so 32 threads fetch 32 tokens. Here one `FcmAccessToken` fetches a token when
there is none or it is within google-auth's refresh threshold of its expiry
(a few minutes), under a lock, and every thread sends with it.

A refused refresh (google-auth's RefreshError: a revoked key, a wrong
account) is ours to fix, not the push's: `ProviderConfigurationError`. A
token service out of reach is transient.
"""

from __future__ import annotations

import threading

from google.auth.credentials import Credentials
from google.auth.exceptions import RefreshError, TransportError
from google.auth.transport.requests import Request

from providers.errors import ProviderConfigurationError, TransientProviderError


class FcmAccessToken:
    """The `Authorization` header every FCM request carries, fetched once per lifetime."""

    def __init__(self, credentials: Credentials, *, provider: str = "fcm") -> None:
        self._credentials = credentials
        self._provider = provider
        self._lock = threading.Lock()
        self._request = Request()
        self.fetched = 0  # tokens fetched so far

    def header(self) -> str:
        """`Bearer <token>`, fetching a new token only when there is none or it is due."""
        with self._lock:
            if not self._credentials.valid:
                try:
                    self._credentials.refresh(self._request)  # type: ignore[no-untyped-call]
                except RefreshError as exc:
                    raise ProviderConfigurationError(
                        "AccessTokenRefused", provider=self._provider
                    ) from exc
                except TransportError as exc:
                    raise TransientProviderError(
                        "AccessTokenUnavailable", provider=self._provider
                    ) from exc
                self.fetched += 1
            return f"Bearer {self._credentials.token}"

    def refused(self, header: str) -> None:
        """FCM answered 401 to `header`: fetch a new token next time, unless one came since."""
        with self._lock:
            if header == f"Bearer {self._credentials.token}":
                self._credentials.token = None
