"""How long a claim must live, from the app's retry policies; `run` refuses less.

A claim (a processed_messages row) is what makes a second copy of a message
harmless. Copies keep coming after the first delivery for as long as:

    retry horizon    a copy can sit in delay tiers: each of the policy's
                     `max_attempts - 1` retries may wait up to its longest tier
                     (a handler's `Retry(delay=...)` or a provider's
                     Retry-After can pick any tier), so the horizon is the sum
                     of the longest tier over those retries
    replay window    how long after that an operator may still replay a dead
                     letter (`IW_REPLAY_WINDOW_DAYS`), or a publisher retry

Retention (`IW_RETENTION_DAYS`) must cover both, for the slowest queue of the
app; otherwise a copy arriving after cleanup deleted the claim would apply
a second time. Not counted, because no policy bounds them: waits that spend
no attempt (a push job whose device another worker is sending to right now
waits out the lease; a batch held while the database is down) and a
publisher's own retries beyond the replay window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from consumers.handlers.retry import RetryPolicy
from consumers.handlers.spec import HandlerSpec
from consumers.message.decisions import ConfigurationError
from consumers.settings import RetentionSettings


def retry_horizon(policy: RetryPolicy) -> timedelta:
    """The longest a copy can keep coming back through the delay tiers."""
    return timedelta(seconds=(policy.max_attempts - 1) * max(policy.tiers_seconds))


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionNeed:
    queue: str  # the queue whose policy has the longest horizon ("" if none)
    policy: RetryPolicy
    horizon: timedelta
    replay_window: timedelta

    @property
    def required(self) -> timedelta:
        return self.horizon + self.replay_window


class RetentionTooShort(ConfigurationError):
    """Retention is shorter than the retry horizon plus the replay window."""

    def __init__(self, keep: timedelta, need: RetentionNeed, *, setting: str) -> None:
        self.keep = keep
        self.need = need
        policy = need.policy
        where = f"queue {need.queue!r}" if need.queue else "the default retry policy"
        super().__init__(
            f"retention ({setting}={_days(keep)}) is shorter than what the handlers need:"
            f" {_days(need.required)} days = retry horizon {_span(need.horizon)}"
            f" ({where}: {policy.max_attempts} attempts, each retry may wait up to"
            f" {max(policy.tiers_seconds):g} s in the longest tier)"
            f" + replay window {_span(need.replay_window)} (IW_REPLAY_WINDOW_DAYS)."
            " A copy redelivered or replayed after its claim is deleted would apply a second"
            f" time. Fix: set {setting} to at least {_at_least(need.required)}, or shorten"
            " IW_REPLAY_WINDOW_DAYS, or give that queue's RetryPolicy fewer attempts or"
            " shorter tiers."
        )


def retention_need(
    specs: Mapping[str, HandlerSpec], retention: RetentionSettings, default: RetryPolicy
) -> RetentionNeed:
    """What the slowest of `specs` (or `default`, with none) needs retention to cover."""
    candidates = [(spec.queue, spec.retry) for spec in specs.values()] or [("", default)]
    queue, policy = max(candidates, key=lambda pair: retry_horizon(pair[1]))
    return RetentionNeed(
        queue=queue,
        policy=policy,
        horizon=retry_horizon(policy),
        replay_window=retention.replay_window,
    )


def check_retention(
    keep: timedelta, need: RetentionNeed, *, setting: str = "IW_RETENTION_DAYS"
) -> None:
    """Raise RetentionTooShort when `keep` does not cover `need`."""
    if keep < need.required:
        raise RetentionTooShort(keep, need, setting=setting)


def _days(span: timedelta) -> str:
    days = span / timedelta(days=1)
    return f"{days:.4g}" if days < 1 else f"{days:.2f}".rstrip("0").rstrip(".")


def _at_least(span: timedelta) -> str:
    """Days, rounded up to two decimals: a value that is enough."""
    return f"{math.ceil(span / timedelta(days=1) * 100) / 100:g}"


def _span(span: timedelta) -> str:
    seconds = span.total_seconds()
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"
