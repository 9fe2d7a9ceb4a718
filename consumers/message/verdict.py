"""What happens to one delivery once its batch is decided."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    """The log event name of each outcome."""

    EFFECT_COMMITTED = "effect_committed"
    DUPLICATE_IGNORED = "duplicate_ignored"
    MESSAGE_ID_REUSED = "message_id_reused"
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD_LETTERED = "dead_lettered"
    MESSAGE_CANCELLED = "message_cancelled"  # an ingress message cancelled before it was taken


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    outcome: Outcome
    reason: str = ""
    delay: float | None = None  # wanted delay for a retry (None: the policy's backoff)
    error: str = ""  # the exception, for the dead letter's headers and the log
    # False when waiting is not the message's fault (another worker holds its
    # send lease): it goes through a delay tier without spending an attempt.
    spend_attempt: bool = True


EFFECT = Verdict(outcome=Outcome.EFFECT_COMMITTED)
DUPLICATE = Verdict(outcome=Outcome.DUPLICATE_IGNORED)
REUSED = Verdict(outcome=Outcome.MESSAGE_ID_REUSED, reason="message_id_reused")
CANCELLED = Verdict(outcome=Outcome.MESSAGE_CANCELLED)


def dead(reason: str, error: str = "") -> Verdict:
    return Verdict(outcome=Outcome.DEAD_LETTERED, reason=reason, error=error)


def retry(
    reason: str, delay: float | None = None, error: str = "", *, spend_attempt: bool = True
) -> Verdict:
    return Verdict(
        outcome=Outcome.RETRY_SCHEDULED,
        reason=reason,
        delay=delay,
        error=error,
        spend_attempt=spend_attempt,
    )


def error_text(exc: BaseException) -> str:
    """The exception as `x-error` and a log line carry it: type and text, bounded."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."
