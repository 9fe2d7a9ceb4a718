"""What a provider's answer means: for the target's ledger row, for the provider's circuit,
and, once every target of a job has answered, for the job's message.

| the answer | the row | the job |
|---|---|---|
| accepted | `sent` + the provider's id | effect committed |
| InvalidDeviceToken | `failed` (the hook prunes it) | effect committed |
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

import structlog

from consumers.handlers.spec import DeadToken
from consumers.message.verdict import EFFECT, Verdict, error_text, retry
from consumers.pipeline.deliveries import Item
from consumers.push.circuit import ProbeResult
from consumers.push.job import PushJob
from consumers.telemetry.logs import OutcomeLines
from dedupe import DedupeKey, SendResult, SendStatus, TargetKey, UnknownOutcome
from providers import (
    InvalidDeviceToken,
    NotStartedInTime,
    PermanentProviderError,
    PlatformRouter,
    Provider,
    ProviderConfigurationError,
    ProviderReceipt,
    SendIds,
    Target,
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
    """One leased target to send: the job, the device, its ids, the provider it goes to."""

    item: Item
    job: PushJob
    target: TargetKey
    device: Target
    ids: SendIds
    provider: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Answered:
    """A send and what its answer means for its row."""

    send: Send
    result: SendResult
    defer: Defer | None = None
    retry_after: float | None = None
    dead_token: bool = False


def answered(
    send: Send, answer: ProviderReceipt | BaseException, policy: UnknownOutcome
) -> Answered:
    """The row's next state for `answer` (a receipt, or what `Provider.send` raised)."""
    target = send.target
    if isinstance(answer, ProviderReceipt):
        result = SendResult(
            target=target, status=SendStatus.SENT, provider_message_id=answer.provider_message_id
        )
        return Answered(send=send, result=result)
    if isinstance(answer, PermanentProviderError):
        failed = SendResult(target=target, status=SendStatus.FAILED, failure_reason=answer.reason)
        return Answered(send=send, result=failed, dead_token=isinstance(answer, InvalidDeviceToken))
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
    """What an answer says about our credentials (see `consumers.push.circuit`)."""
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


def metric_outcome(answer: Answered) -> str:
    """The `outcome` label of a recorded answer: sent, failed, invalid_token, deferred, unknown."""
    status = answer.result.status
    if status is SendStatus.SENT:
        return "sent"
    if answer.dead_token:
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


def provider_name(provider: Provider, device: Target) -> str:
    """The name of the provider `device` goes to (a router's own, inside)."""
    if isinstance(provider, PlatformRouter):
        return provider.provider_for(device).name
    return provider.name


def redact(token: str) -> str:
    return f"{token[:6]}…" if len(token) > 8 else "…"


def log_answer(
    answer: Answered, *, consumer: str, recorded: bool, lines: OutcomeLines | None = None
) -> None:
    """One line per target answered: push_sent, invalid_token, push_failed or push_deferred.

    `lines`: the fast path (`consumers.telemetry.logs.outcome_lines()`), written by the caller.
    """
    send, result = answer.send, answer.result
    fields: dict[str, object] = {
        "consumer": consumer,
        "tenant": send.target.key.tenant,
        "message_id": send.target.key.message_id,
        "attempt": send.item.envelope.attempt if send.item.envelope else 1,
        "target": send.target.target_index,
        "platform": str(send.device.platform),
        "token": redact(send.device.token),
        "provider": send.provider,
        "apns_id": send.ids.apns_id,
        "collapse_id": send.ids.collapse_id,
        "recorded": recorded,
    }
    if result.status is SendStatus.SENT and lines is not None:
        # The keys in the order the structlog call below would give them.
        lines.line(
            "push_sent", "info", {"provider_message_id": result.provider_message_id, **fields}
        )
    elif result.status is SendStatus.SENT:
        log.info("push_sent", provider_message_id=result.provider_message_id, **fields)
    elif answer.dead_token:
        log.warning("invalid_token", reason=result.failure_reason, **fields)
    elif result.status is SendStatus.FAILED:
        log.warning("push_failed", reason=result.failure_reason, **fields)
    else:
        log.warning(
            "push_deferred", reason=result.failure_reason, retry_after=answer.retry_after, **fields
        )


def dead_token(answer: Answered) -> DeadToken:
    """The hook's view of a token the provider called bad or unregistered."""
    send = answer.send
    return DeadToken(
        tenant=send.target.key.tenant,
        message_id=send.target.key.message_id,
        platform=str(send.device.platform),
        token=send.device.token,
        reason=answer.result.failure_reason or "",
    )
