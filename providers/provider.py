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

    `deadline` (`time.monotonic()` seconds, the clock of asyncio's loop) is when the
    caller stops trusting an answer, its ledger lease ending: a request that cannot
    start at least `answer_seconds` before it is not sent at all (`NotStartedInTime`),
    whatever queue it waited in. None: no deadline but the provider's own timeout.

    `answer_seconds`: the longest a request can take once started (the provider's
    timeouts). `max_in_flight`: how many sends it runs at once right now; a caller
    hands it no more, so a send waits in the caller's queue, where the deadline it
    is given is read when it can start, not in the provider's queue with a stale one.
    """

    name: str
    answer_seconds: float

    @property
    def max_in_flight(self) -> int: ...

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt: ...

    async def aclose(self) -> None: ...
