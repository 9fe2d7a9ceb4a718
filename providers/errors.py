"""What can go wrong when a provider sends, and what the caller should do about it.

```
ProviderError                  root: every failure a provider raises
  TransientProviderError       429, 5xx, or the connection failed BEFORE the request
                               was written: nothing was sent, retry later
                               (retry_after: the provider's Retry-After, seconds)
    NotStartedInTime           the request could not start with its whole timeout
                               before the caller's deadline: nothing was sent
    ProviderConfigurationError our credentials or configuration were refused (bad or
                               expired provider token, wrong topic, OAuth refused):
                               nothing was sent and no push is at fault; pause the
                               provider until a probe succeeds
  PermanentProviderError       do not retry: invalid payload, bad topic, bad auth...
    TargetGone                 the target is gone for good: a webhook endpoint that
                               answered 410, a mailbox that does not exist
      InvalidDeviceToken       the token is bad or unregistered: prune the device
  UnknownOutcomeError          timeout, or the connection was lost AFTER the request
                               may have reached the provider: it may have been sent
```

A provider never resends on its own: an unknown outcome is reported as
`UnknownOutcomeError`, and what to do next (resend with the same ids, or skip) is
the caller's policy.
"""

from __future__ import annotations

import datetime
import email.utils


class ProviderError(Exception):
    """Root of every provider failure: `reason` says what happened, `status` is the HTTP one."""

    def __init__(self, reason: str, *, status: int | None = None, provider: str = "") -> None:
        self.reason = reason
        self.status = status
        self.provider = provider
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = f"{self.provider}: " if self.provider else ""
        status = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{where}{self.reason}{status}"


class TransientProviderError(ProviderError):
    """Not sent, or refused for now: retry later, no sooner than `retry_after` seconds."""

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        provider: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.retry_after = retry_after
        super().__init__(reason, status=status, provider=provider)

    def _describe(self) -> str:
        after = f", retry after {self.retry_after:g}s" if self.retry_after is not None else ""
        return super()._describe() + after


class NotStartedInTime(TransientProviderError):
    """The send could not start early enough to be answered before its deadline: not sent."""


class ProviderConfigurationError(TransientProviderError):
    """The provider refused our credentials or configuration, not this push: nothing was
    sent, and every other push would be refused the same way until someone fixes it."""


class PermanentProviderError(ProviderError):
    """The provider refused this push for good: retrying the same push cannot succeed."""


class TargetGone(PermanentProviderError):
    """The target is gone for good: stop sending to it (the ledger's kind and the app's
    hook are told: a webhook endpoint is disabled, a device pruned)."""


class InvalidDeviceToken(TargetGone):
    """The device token is malformed or no longer registered: prune the device."""


class UnknownOutcomeError(ProviderError):
    """The request may have reached the provider: it may or may not have been delivered."""


def retry_after_seconds(header: str | None) -> float | None:
    """A Retry-After header (seconds, or an HTTP date) as seconds from now; None if absent."""
    if header is None or not header.strip():
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())
