"""Retry policy: exponential backoff with full jitter, over fixed delay tiers.

A retried message is republished to `<queue>.retry.<ms>`, a queue whose
message TTL is that delay and which dead-letters back to the work queue. The
tier chosen is the smallest at or above the wanted delay (a handler's
`Retry(delay=...)` or a provider's Retry-After), so a message never comes
back sooner than asked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    max_attempts: int = 5
    base_seconds: float = 1.0
    cap_seconds: float = 600.0
    tiers_seconds: tuple[float, ...] = (1.0, 5.0, 30.0, 120.0, 600.0, 3600.0)
    # Handler exceptions of these kinds are retried; any other is dead-lettered
    # at once as `handler_error`. Database transients are always retried.
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not self.tiers_seconds or sorted(self.tiers_seconds) != list(self.tiers_seconds):
            raise ValueError("tiers_seconds must be a non-empty ascending tuple")
        if any(t <= 0 for t in self.tiers_seconds):
            raise ValueError("tiers_seconds must be positive")

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]."""
        doublings = min(max(attempt - 1, 0), 64)  # the attempt comes off the wire
        ceiling = min(self.cap_seconds, self.base_seconds * 2**doublings)
        return (rng or random).uniform(0, ceiling)

    def tier_for(self, delay: float) -> float:
        """The smallest tier at or above `delay` (the largest tier if none is)."""
        for tier in self.tiers_seconds:
            if tier >= delay:
                return tier
        return self.tiers_seconds[-1]

    def tier_within(self, delay: float) -> float:
        """The largest tier at or below `delay` (the smallest tier if none is).

        For a wait whose end is known (another worker's lease): back by then,
        never a whole tier later; coming back early only means waiting again.
        """
        within = [tier for tier in self.tiers_seconds if tier <= delay]
        return within[-1] if within else self.tiers_seconds[0]

    def exhausted(self, attempt: int) -> bool:
        """True when `attempt` was the last one allowed."""
        return attempt >= self.max_attempts


def tier_queue(queue: str, tier_seconds: float) -> str:
    return f"{queue}.retry.{round(tier_seconds * 1000)}ms"


def dead_letter_queue(queue: str) -> str:
    return f"{queue}.dlq"


def bulk_lane(queue: str) -> str:
    """An effects queue's bulk lane: the parts of sends of many targets go there
    (`consumers.publishing.parts`), consumed beside the queue with a prefetch of about
    what a worker holds, so a send's parts stay in the broker for every worker."""
    return f"{queue}.bulk"
