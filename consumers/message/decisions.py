"""What a handler raises to decide a message's fate, and the errors of `consumers`.

ConsumersError
  ConfigurationError   a bad app or settings (duplicate queue, bad spec)
HandlerDecision        raised by handlers, not errors
  Retry(delay=...)     run this message again later (a delay tier at or above `delay`)
  Reject(reason=...)   dead-letter this message now with `reason`
"""

from __future__ import annotations


class ConsumersError(Exception):
    """Root of the errors raised by `consumers` itself."""


class ConfigurationError(ConsumersError):
    """The app or its settings cannot work as given."""


class HandlerDecision(Exception):
    """A handler's explicit decision about its message."""


class Retry(HandlerDecision):
    """Roll back this message's effects and deliver it again after `delay` seconds."""

    def __init__(self, delay: float | None = None, reason: str = "retry_requested") -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class Reject(HandlerDecision):
    """Roll back this message's effects and dead-letter it with `reason`."""

    def __init__(self, reason: str) -> None:
        if not reason:
            raise ValueError("Reject needs a reason")
        super().__init__(reason)
        self.reason = reason
