"""The APNs provider token: one JWT per signing key, shared by every connection.

Apple checks the token's age: older than an hour is `ExpiredProviderToken`,
and a new token sooner than 20 minutes after the last one is
`TooManyProviderTokenUpdates`. aioapns signs a new token per connection, so ten
connections mean ten tokens within seconds. Here one `ApnsToken` per key signs
one token and hands the same header to every connection; it signs the next one
once the token is `refresh_seconds` old (default 50 minutes; 20 to 55 allowed),
or after APNs called it expired, but never younger than 20 minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jwt

MIN_AGE_SECONDS = 20 * 60  # Apple: at most one new token per 20 minutes
MAX_AGE_SECONDS = 55 * 60  # Apple refuses tokens older than 60 minutes
REFRESH_SECONDS = 50 * 60
EXPIRED_REASON = "ExpiredProviderToken"


class ApnsToken:
    """The shared `authorization` header of one key (aioapns' AuthorizationHeaderProvider)."""

    def __init__(
        self,
        *,
        key: str,
        key_id: str,
        team_id: str,
        refresh_seconds: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not MIN_AGE_SECONDS <= refresh_seconds <= MAX_AGE_SECONDS:
            raise ValueError(f"refresh_seconds must be within {MIN_AGE_SECONDS}-{MAX_AGE_SECONDS}")
        self._key = key
        self._key_id = key_id
        self._team_id = team_id
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._header = ""
        self._issued_at = 0.0
        self.signed = 0  # tokens signed so far

    def get_header(self) -> str:
        """`bearer <jwt>`: the current token, signed anew only when it is due."""
        now = self._clock()
        if not self._header or now - self._issued_at >= self._refresh_seconds:
            self._sign(now)
        return self._header

    def refused(self, reason: str | None) -> None:
        """APNs answered 403 `reason`: for ExpiredProviderToken sign a new token, if 20
        minutes allow it (any other refusal is not the token's age)."""
        now = self._clock()
        if reason == EXPIRED_REASON and now - self._issued_at >= MIN_AGE_SECONDS:
            self._sign(now)

    def _sign(self, now: float) -> None:
        issued_at = int(now)
        token = jwt.encode(
            {"iss": self._team_id, "iat": issued_at},
            self._key,
            algorithm="ES256",
            headers={"kid": self._key_id},
        )
        self._header = f"bearer {token}"
        self._issued_at = float(issued_at)
        self.signed += 1
