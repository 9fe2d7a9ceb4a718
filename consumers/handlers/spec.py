"""What the app registers, as values: one `HandlerSpec` per queue, and the types they hold.

`App` builds these; the worker and the runners read them. Nothing here
imports a runner, so the registry and the runners never import each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from consumers.handlers.context import Batch, Context
from consumers.handlers.retry import RetryPolicy
from consumers.jobs.kind import DeadTarget, EffectKind
from consumers.message.envelope import Fingerprinter
from dedupe import DbConnection, UnknownOutcome
from providers import Sender

# What the app does with a target the provider called dead (prune the device),
# in the transaction that records it.
InvalidTokenHook = Callable[[DbConnection, DeadTarget], Awaitable[None]]


MessageHandler = Callable[[Context], Awaitable[None]]
BatchHandler = Callable[[Batch], Awaitable[None]]


# Builds a queue's sender once, inside the worker's event loop (aioapns needs it).
ProviderFactory = Callable[[], Awaitable[Sender[Any]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectSpec:
    """How a queue of external effects sends: see `App.push_handler`, `App.effect_handler`.

    `kind` reads its jobs (`consumers.jobs.kind`); `provider` builds the sender its
    effects go through. `unknown_outcome` is for a channel that neither replays by key
    nor can be asked (`providers.Recovery`); the others resolve an unknown outcome
    by what they offer."""

    kind: EffectKind[Any]
    provider: ProviderFactory
    on_invalid_token: InvalidTokenHook | None = None
    unknown_outcome: UnknownOutcome = UnknownOutcome.RESEND
    lease_seconds: float = 30.0
    probe_seconds: float = 10.0  # a paused provider's first probe; see consumers.effects.circuit


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerSpec:
    queue: str
    handle: MessageHandler | None = None
    handle_batch: BatchHandler | None = None
    effects: EffectSpec | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    fingerprint: Fingerprinter | None = None
    # A handler's deadline in seconds (None: WorkerSettings.handler_timeout_seconds).
    timeout: float | None = None
