"""The seam every sender implements, and what a successful send gives back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from providers.ids import SendIds
from providers.push import Push


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderReceipt:
    """The provider accepted the push: APNs' answered apns-id, or FCM's message name."""

    provider: str
    provider_message_id: str


class Provider(Protocol):
    """Sends one push with stable ids; raises a `providers.errors.ProviderError` on failure.

    One call is one attempt: exactly one request reaches the provider, or none (then
    `TransientProviderError`), or the outcome is unknown (`UnknownOutcomeError`).
    A provider never resends on its own.
    """

    name: str

    async def send(self, push: Push, ids: SendIds) -> ProviderReceipt: ...

    async def aclose(self) -> None: ...
