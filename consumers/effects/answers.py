"""What a provider's answer means: for the target's ledger row, for the provider's circuit,
and, once every target of a job has answered, for the job's message.

| the answer | the row | the job |
|---|---|---|
| accepted (or found by a lookup) | `sent` + the provider's id | effect committed |
| TargetGone (a dead token...) | `failed`; the kind's `gone`, the app's hook | effect committed |
| PermanentProviderError | `failed` | effect committed |
| ProviderConfigurationError | `claimed` | retried when the probe is due, free |
| NotStartedInTime | `claimed` | retried at once, free (our lease, not the provider) |
| TransientProviderError | `claimed` | retried, no sooner than Retry-After |
| UnknownOutcomeError, a bug | `claimed` (RESEND), `failed` (SKIP) | retried / committed |

("free": no attempt spent.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import structlog

from consumers.effects.circuit import ProbeResult
from consumers.jobs.kind import DeadTarget, EffectKind, Recipient, shown_address
from consumers.message.verdict import EFFECT, Verdict, error_text, retry
from consumers.pipeline.deliveries import Item
from consumers.telemetry.logs import OutcomeLines
from dedupe import DedupeKey, SendResult, SendStatus, TargetKey, UnknownOutcome
from providers import (
    NotStartedInTime,
    PermanentProviderError,
    PlatformRouter,
    ProviderConfigurationError,
    ProviderReceipt,
    Sender,
    SendIds,
    TargetGone,
    TransientProviderError,
    UnknownOutcomeError,
)

log = structlog.get_logger(__name__)


class Defer(StrEnum):
    """Why a target went back to `claimed`, most telling first."""

    UNKNOWN = "unknown_outcome"  # it may have been sent
    TRANSIENT = "provider_unavailable"  # refused for now (429, 5xx, no connection)
    NOT_STARTED = "send_not_started"  # it could not start before the lease's end
    PAUSED = "provider_paused"  # the provider refused our credentials: circuit open


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """One leased target to send: the job, whom it goes to, its ids, the provider's name.

    `previous`: the leases the row had before this one (0: its first call).
    `window_ends`: for a channel that replays by key, when (`time.monotonic()`) its
    window ends, never later than the provider's own end; None otherwise."""

    item: Item
    job: Any
    target: TargetKey
    recipient: Recipient
    ids: SendIds
    provider: str
    previous: int = 0
    window_ends: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Answered:
    """A send and what its answer means for its row."""

    send: Send
    result: SendResult
    defer: Defer | None = None
    retry_after: float | None = None
    dead_target: bool = False
    looked_up: bool = False  # the provider had it: found by our key, not sent again


def answered(
    send: Send,
    answer: ProviderReceipt | BaseException,
    policy: UnknownOutcome,
    *,
    looked_up: bool = False,
) -> Answered:
    """The row's next state for `answer` (a receipt, or what `Sender.send` raised)."""
    target = send.target
    if isinstance(answer, ProviderReceipt):
        result = SendResult(
            target=target, status=SendStatus.SENT, provider_message_id=answer.provider_message_id
        )
        return Answered(send=send, result=result, looked_up=looked_up)
    if isinstance(answer, PermanentProviderError):
        failed = SendResult(target=target, status=SendStatus.FAILED, failure_reason=answer.reason)
        return Answered(send=send, result=failed, dead_target=isinstance(answer, TargetGone))
    if isinstance(answer, TransientProviderError):
        defer = Defer.TRANSIENT
        if isinstance(answer, ProviderConfigurationError):
            defer = Defer.PAUSED
        elif isinstance(answer, NotStartedInTime):
            defer = Defer.NOT_STARTED
        claimed = SendResult(target=target, status=SendStatus.CLAIMED, failure_reason=answer.reason)
        return Answered(send=send, result=claimed, defer=defer, retry_after=answer.retry_after)
    # UnknownOutcomeError, or any other failure mid-call: it may have been sent.
    reason = answer.reason if isinstance(answer, UnknownOutcomeError) else error_text(answer)
    if policy is UnknownOutcome.SKIP:
        skipped = f"unknown_outcome_skipped: {reason}"
        failed = SendResult(target=target, status=SendStatus.FAILED, failure_reason=skipped)
        return Answered(send=send, result=failed)
    unknown = SendResult(
        target=target, status=SendStatus.CLAIMED, failure_reason=f"unknown_outcome: {reason}"
    )
    return Answered(send=send, result=unknown, defer=Defer.UNKNOWN)


def paused(send: Send, reason: str, wait: float) -> Answered:
    """Not sent: the provider's circuit is open; come back when its probe is due."""
    claimed = SendResult(
        target=send.target, status=SendStatus.CLAIMED, failure_reason=f"provider_paused: {reason}"
    )
    return Answered(send=send, result=claimed, defer=Defer.PAUSED, retry_after=wait)


def probe_result(answer: ProviderReceipt | BaseException) -> ProbeResult:
    """What an answer says about our credentials (see `consumers.effects.circuit`)."""
    if isinstance(answer, ProviderConfigurationError):
        return ProbeResult.REFUSED
    if isinstance(answer, ProviderReceipt | PermanentProviderError):
        return ProbeResult.ACCEPTED  # the provider took us and judged the push itself
    return ProbeResult.INCONCLUSIVE


def job_verdict(answers: Sequence[Answered]) -> Verdict:
    """A job's verdict once every target it sent this time has answered."""
    deferred = [a for a in answers if a.defer is not None]
    if not deferred:
        return EFFECT
    worst = min(deferred, key=lambda a: list(Defer).index(a.defer or Defer.PAUSED))
    assert worst.defer is not None
    delay = max((a.retry_after for a in deferred if a.retry_after is not None), default=None)
    if worst.defer is Defer.NOT_STARTED and delay is None:
        delay = 0.0  # the soonest tier: the queue that held it back has moved on
    # No attempt spent on our own pause or lease: neither is the provider's failure.
    free = worst.defer in (Defer.PAUSED, Defer.NOT_STARTED)
    why = worst.result.failure_reason or ""
    return retry(str(worst.defer), delay=delay, error=why, spend_attempt=not free)


def dedupe_key_text(key: DedupeKey) -> str:
    """The string the send ids derive from: stable for a job's whole life."""
    return f"{key.consumer}\0{key.tenant}\0{key.message_id}"


def never_sent(send: Send, why: str) -> Answered:
    """Not sent, and never to be: a channel that replays by key, past its window with an
    earlier call's outcome unknown (a call now could be a second, unreplayed one)."""
    failed = SendResult(
        target=send.target, status=SendStatus.FAILED, failure_reason=f"unknown_outcome: {why}"
    )
    return Answered(send=send, result=failed, defer=None)


def metric_outcome(answer: Answered) -> str:
    """The `outcome` label of a recorded answer: sent, found (by a lookup), failed,
    invalid_token, deferred, unknown."""
    status = answer.result.status
    if status is SendStatus.SENT:
        return "found" if answer.looked_up else "sent"
    if answer.dead_target:
        return "invalid_token"
    if status is SendStatus.FAILED:
        return "failed"
    return "unknown" if answer.defer is Defer.UNKNOWN else "deferred"


def metric_outcomes(recorded: Iterable[Answered]) -> dict[str, dict[str, int]]:
    """Recorded answers counted by provider and `metric_outcome`."""
    counts: dict[str, dict[str, int]] = {}
    for answer in recorded:
        of = counts.setdefault(answer.send.provider, {})
        outcome = metric_outcome(answer)
        of[outcome] = of.get(outcome, 0) + 1
    return counts


def sender_for(provider: Sender[Any], channel: str) -> Sender[Any]:
    """The sender a target of `channel` goes to (a router's own, inside)."""
    if isinstance(provider, PlatformRouter):
        return provider.provider_for(channel)
    return provider


def log_answer(
    answer: Answered,
    *,
    consumer: str,
    kind: EffectKind[Any],
    recorded: bool,
    lines: OutcomeLines | None = None,
) -> None:
    """One line per target answered: `<kind>_sent`, `invalid_token`, `<kind>_failed` or
    `<kind>_deferred` (`push_sent`, `webhook_failed`, ...).

    `lines`: the fast path (`consumers.telemetry.logs.outcome_lines()`), written by the caller.
    """
    send, result = answer.send, answer.result
    fields: dict[str, object] = {
        "consumer": consumer,
        "tenant": send.target.key.tenant,
        "message_id": send.target.key.message_id,
        "attempt": send.item.envelope.attempt if send.item.envelope else 1,
        "target": send.target.target_index,
        "channel": send.recipient.channel,
        "address": shown_address(send.recipient.channel, send.recipient.address),
        "provider": send.provider,
        "effect_id": send.ids.effect_id,
        "collapse_id": send.ids.collapse_id,
        "recorded": recorded,
    }
    if answer.looked_up:
        fields["found_by_lookup"] = True
    if result.status is SendStatus.SENT and lines is not None:
        # The keys in the order the structlog call below would give them.
        lines.line(
            f"{kind.name}_sent",
            "info",
            {"provider_message_id": result.provider_message_id, **fields},
        )
    elif result.status is SendStatus.SENT:
        log.info(f"{kind.name}_sent", provider_message_id=result.provider_message_id, **fields)
    elif answer.dead_target:
        log.warning("invalid_token", reason=result.failure_reason, **fields)
    elif result.status is SendStatus.FAILED:
        log.warning(f"{kind.name}_failed", reason=result.failure_reason, **fields)
    else:
        log.warning(
            f"{kind.name}_deferred",
            reason=result.failure_reason,
            retry_after=answer.retry_after,
            **fields,
        )


def dead_target(answer: Answered) -> DeadTarget:
    """The kind's and the hook's view of a target the provider called dead."""
    send = answer.send
    return DeadTarget(
        tenant=send.target.key.tenant,
        message_id=send.target.key.message_id,
        channel=send.recipient.channel,
        address=send.recipient.address,
        reason=answer.result.failure_reason or "",
    )
