"""An effects queue in one worker process: the channels it is consumed on, and what they share.

An effects queue is consumed on `concurrency` channels of the queue itself
(prefetch `push_prefetch`: one-part jobs and every retry) and one of its bulk
lane, `<queue>.bulk` (prefetch `bulk_prefetch`: the parts of large sends, a
few more than the worker holds, so the others stay in the broker for the
other workers). Each channel has a batch loop and a runner of its own; all of
them share, in the process:

- one `Holding`: the targets their batches hold, at most `push_held_devices`
  and the tenants' reserve, each tenant within its own limit
  (`consumers.pipeline.holding`);
- one `ProviderGate`: the provider's sends in flight, handed round the
  tenants (`consumers.effects.gate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from consumers.effects.gate import ProviderGate
from consumers.handlers.retry import bulk_lane
from consumers.jobs.kind import EffectKind
from consumers.pipeline.deliveries import Delivery
from consumers.pipeline.holding import Holding
from consumers.settings import Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class Lane:
    """One channel to open: the queue it consumes, its prefetch, its number among them."""

    queue: str
    prefetch: int
    n: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectsShared:
    """What an effects queue's channels share in a process."""

    holding: Holding
    gate: ProviderGate


def lanes(queue: str, settings: Settings) -> list[Lane]:
    """The channels of an effects queue: `concurrency` of the queue, one of its bulk lane."""
    ws = settings.worker
    return [
        *(Lane(queue=queue, prefetch=ws.push_prefetch, n=n) for n in range(ws.concurrency)),
        Lane(queue=bulk_lane(queue), prefetch=ws.bulk_prefetch, n=0),
    ]


def effects_shared(kind: EffectKind[Any], settings: Settings) -> EffectsShared:
    """A new holding (jobs weighed by `kind`) and provider gate for one effects queue."""
    ws, tenants = settings.worker, settings.tenants

    def weigh(delivery: Delivery) -> int:
        return kind.weigh(delivery.body, max_body_bytes=ws.max_body_bytes)

    return EffectsShared(
        holding=Holding(
            limit=ws.push_held_devices,
            weigh=weigh,
            reserve=tenants.reserved_devices,
            tenant_limit=tenants.held_devices,
            tenant_limits=tenants.held_devices_by_tenant,
        ),
        gate=ProviderGate(),
    )
