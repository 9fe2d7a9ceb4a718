"""The span of one provider call, when tracing is on (`consumers.telemetry.tracing`).

"send <provider>", a CLIENT span, a child of its job's "process" span
(`consumers.pipeline.traced`), from the send's turn in the provider's gate to
its answer, with what the ledger records of it: `idempotent_workers.channel`,
`idempotent_workers.effect_id` (the apns-id, webhook-id, Message-ID or
idempotency key it carried), `idempotent_workers.status` (sent, failed,
claimed) and `idempotent_workers.provider_message_id` (the apns-id APNs
answered, FCM's message name, the push service's Location, ...).
"""

from __future__ import annotations

from consumers.effects.answers import Answered, Send
from consumers.telemetry.tracing import Span, SpanKind, tracing
from dedupe import SendStatus


def send_span(send: Send) -> Span | None:
    return tracing().span(
        f"send {send.provider}",
        SpanKind.CLIENT,
        parent=send.item.span,
        attributes={
            "idempotent_workers.provider": send.provider,
            "idempotent_workers.channel": send.recipient.channel,
            "idempotent_workers.effect_id": send.ids.effect_id,
            "idempotent_workers.target": send.target.target_index,
            "idempotent_workers.previous_sends": send.previous,
        },
    )


def close_send(span: Span, answer: Answered) -> None:
    result = answer.result
    span.set_attribute("idempotent_workers.status", str(result.status))
    if result.provider_message_id is not None:
        span.set_attribute("idempotent_workers.provider_message_id", result.provider_message_id)
    if answer.looked_up:
        span.set_attribute("idempotent_workers.found_by_lookup", True)
    if result.status is not SendStatus.SENT:
        tracing().fail(span, result.failure_reason or str(result.status))
    span.end()
