"""A fake provider's quota: past a rate, requests are answered 429 with a Retry-After.

```python
async with FakeFcm() as fcm:
    fcm.rate_limit = FakeRateLimit(per_second=100, burst=20)
    ...
    assert fcm.rate_limit.refused == 0  # the fleet kept the quota
```

A token bucket on the fake's clock: `burst` requests at once, refilled at
`per_second`; a request finding it empty is refused before its token is read,
as FCM answers QUOTA_EXCEEDED and APNs TooManyRequests, and counted in `refused`.
"""

from __future__ import annotations

import time


class FakeRateLimit:
    """At most `burst` requests at once and `per_second` on average; the rest refused."""

    def __init__(self, *, per_second: float, burst: float, retry_after: int = 1) -> None:
        if per_second <= 0 or burst < 1:
            raise ValueError("a rate limit needs a positive rate and a burst of at least 1")
        self.per_second = per_second
        self.burst = burst
        self.retry_after = retry_after  # the Retry-After of a refusal, seconds
        self.refused = 0
        self._tokens = burst
        self._at = time.monotonic()

    def admit(self) -> bool:
        """Take one request's token; False (and counted) when the bucket is empty."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_second)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.refused += 1
        return False
