"""The seam every sender implements, what a successful send gives back, and what a
channel offers once a call's outcome is unknown.

A sender takes one effect (a push, a webhook call, an e-mail, an API request) with
the ids the ledger derived for it and makes one attempt. What may happen after a
crash mid-call depends on the channel, and the channel says so (`Recovery`):

    REPLAYS_BY_KEY  the provider replays a call with the same key within a window
                    (Stripe, Adyen): call again with the same key, only while the
                    call can reach it inside the window
    LOOKUP_BY_KEY   the provider can be asked about a call by our key (Svix,
                    Postmark): `look_up` first, and call only if it never arrived
    NEITHER         neither (SES, SMTP, APNs, FCM, Web Push, our webhooks): the
                    queue's resend/skip policy, with the channel's collapse id (or
                    the receiver's dedupe by webhook-id) as the backstop
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeAlias, TypeVar, runtime_checkable

from providers.ids import SendIds
from providers.push import Push

E_contra = TypeVar("E_contra", contravariant=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderReceipt:
    """The provider accepted the effect: APNs' answered apns-id, FCM's message name, the
    Web Push message resource, the webhook id, the e-mail's Message-ID, the API's object id."""

    provider: str
    provider_message_id: str


class RecoveryKind(StrEnum):
    REPLAYS_BY_KEY = "replays_by_key"
    LOOKUP_BY_KEY = "lookup_by_key"
    NEITHER = "neither"


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """What a channel offers once a call's outcome is unknown (see the module docstring).

    `window_seconds`: for REPLAYS_BY_KEY, how long the provider replays a key; a call
    that could reach it later than that after the first is never started."""

    kind: RecoveryKind
    window_seconds: float | None = None

    def __post_init__(self) -> None:
        replays = self.kind is RecoveryKind.REPLAYS_BY_KEY
        if replays and not (self.window_seconds is not None and self.window_seconds > 0):
            raise ValueError("a channel that replays by key needs a positive window_seconds")
        if not replays and self.window_seconds is not None:
            raise ValueError("window_seconds is only for a channel that replays by key")


NEITHER = Recovery(kind=RecoveryKind.NEITHER)
LOOKUP_BY_KEY = Recovery(kind=RecoveryKind.LOOKUP_BY_KEY)


def replays_within(seconds: float) -> Recovery:
    """A channel that replays a call with the same key for `seconds` after the first."""
    return Recovery(kind=RecoveryKind.REPLAYS_BY_KEY, window_seconds=seconds)


class Sender(Protocol[E_contra]):
    """Sends one effect with stable ids; raises a `providers.errors.ProviderError` on failure.

    One call is one attempt: exactly one request reaches the provider, or none (then
    `TransientProviderError`), or the outcome is unknown (`UnknownOutcomeError`).
    A sender never resends on its own.

    `deadline` (`time.monotonic()` seconds, the clock of asyncio's loop) is when the
    caller stops trusting an answer, its ledger lease ending: a request that cannot
    start at least `answer_seconds` before it is not sent at all (`NotStartedInTime`),
    whatever queue it waited in. None: no deadline but the sender's own timeout.

    `answer_seconds`: the longest a request can take once started (the sender's
    timeouts). `max_in_flight`: how many sends it runs at once right now; a caller
    hands it no more, so a send waits in the caller's queue, where the deadline it
    is given is read when it can start, not in the sender's queue with a stale one.
    `recovery`: what the channel offers after a crash; a LOOKUP_BY_KEY sender is also
    a `LooksUp`.
    """

    name: str
    answer_seconds: float
    recovery: Recovery

    @property
    def max_in_flight(self) -> int: ...

    async def send(
        self, effect: E_contra, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class LooksUp(Protocol[E_contra]):
    """A sender whose provider can be asked about a call by our key.

    `look_up` makes one request: the receipt of the call that carried `ids`, or None
    when the provider never received one (then calling is safe); an answer it cannot
    give is a `ProviderError`, as for `send`."""

    async def look_up(
        self, effect: E_contra, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt | None: ...


# The push senders: APNs, FCM, Web Push, and a router of them.
Provider: TypeAlias = Sender[Push]
