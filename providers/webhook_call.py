"""What one webhook call is (`WebhookCall`) and the `webhook-id` it carries.

Apart from `providers.webhooks` (the sender, which needs the `webhooks` extra), so
that a job's kind builds calls, and a test names their ids, with no HTTP client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from providers.ids import SendIds


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookCall:
    """One webhook to one endpoint: where, the exact body (signed as is, the same bytes
    on every attempt), and the endpoint's live `whsec_` secrets, newest first.

    The body and secrets are kept out of `repr`: a call may appear in a traceback."""

    url: str
    body: bytes = field(repr=False)
    secrets: tuple[str, ...] = field(repr=False)

    def __post_init__(self) -> None:
        if not self.secrets:
            raise ValueError("a webhook call needs at least one signing secret")


def webhook_id(ids: SendIds) -> str:
    """The `webhook-id` of a target: `msg_` and the 32 hex digits of its effect_id, the
    same on every attempt (the Standard Webhooks id a receiver dedupes by; no `.`)."""
    return "msg_" + ids.effect_id.replace("-", "")
