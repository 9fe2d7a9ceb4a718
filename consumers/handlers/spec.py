"""What the app registers, as values: one `HandlerSpec` per queue, and the types they hold.

`App` builds these; the worker and the runners read them. Nothing here
imports a runner, so the registry and the runners never import each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from consumers.handlers.context import Batch, Context
from consumers.handlers.retry import RetryPolicy
from consumers.message.envelope import Fingerprinter
from dedupe import DbConnection, UnknownOutcome
from providers import Provider


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadToken:
    """A device token the provider called bad or unregistered: prune the device."""

    tenant: str
    message_id: str
    platform: str
    token: str
    reason: str


InvalidTokenHook = Callable[[DbConnection, DeadToken], Awaitable[None]]


MessageHandler = Callable[[Context], Awaitable[None]]
BatchHandler = Callable[[Batch], Awaitable[None]]


ProviderFactory = Callable[[], Awaitable[Provider]]


@dataclass(frozen=True, slots=True, kw_only=True)
class PushSpec:
    """How a push queue sends: see `App.push_handler`."""

    provider: ProviderFactory
    on_invalid_token: InvalidTokenHook | None = None
    unknown_outcome: UnknownOutcome = UnknownOutcome.RESEND
    lease_seconds: float = 30.0
    probe_seconds: float = 10.0  # a paused provider's first probe; see consumers.push.circuit


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerSpec:
    queue: str
    handle: MessageHandler | None = None
    handle_batch: BatchHandler | None = None
    push: PushSpec | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    fingerprint: Fingerprinter | None = None
    # A handler's deadline in seconds (None: WorkerSettings.handler_timeout_seconds).
    timeout: float | None = None
