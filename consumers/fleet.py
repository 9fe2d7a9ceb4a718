"""Settings of one fleet serving many tenants: what each tenant's jobs may hold in a worker,
and the provider quotas the whole fleet keeps (read by `Settings.from_env`).

    IW_TENANT_HELD_DEVICES            one tenant's devices held in a worker's effects queue
    IW_TENANT_HELD_DEVICES_BY_TENANT  overrides by tenant, a JSON object: {"acme": 20000}
    IW_TENANT_RESERVED_DEVICES        held above the queue's limit by light tenants
    IW_PROVIDER_QUOTAS                quotas by name, a JSON object:
                                      {"fcm": 10000, "apns:<topic>": {"per_second": N, "burst": M}}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantSettings:
    """What each tenant's jobs may hold in an effects queue's worker (consumers.pipeline.holding).

    `held_devices`: the targets of one tenant's jobs a worker holds at once
    (IW_TENANT_HELD_DEVICES; None: the queue's push_held_devices, no cap of its
    own); `held_devices_by_tenant`: overrides for named tenants
    (IW_TENANT_HELD_DEVICES_BY_TENANT, a JSON object: `{"acme": 20000}`);
    `reserved_devices`: held above push_held_devices by tenants holding less than
    the tenant holding the most (IW_TENANT_RESERVED_DEVICES), so another
    tenant's large send never leaves a small job without room."""

    held_devices: int | None = None
    held_devices_by_tenant: Mapping[str, int] = field(default_factory=dict)
    reserved_devices: int = 1_000

    def __post_init__(self) -> None:
        limits = [self.held_devices or 1, *self.held_devices_by_tenant.values()]
        if min(limits) < 1 or self.reserved_devices < 0:
            raise ValueError(
                "tenant held devices must be at least 1 and reserved_devices at least 0"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TenantSettings:
        held = env.get("IW_TENANT_HELD_DEVICES", "")
        return cls(
            held_devices=int(held) if held else None,
            held_devices_by_tenant=_json_ints(env, "IW_TENANT_HELD_DEVICES_BY_TENANT"),
            reserved_devices=int(env.get("IW_TENANT_RESERVED_DEVICES", "1000")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderQuota:
    """One provider project's rate, kept by the whole fleet (consumers.effects.quota):
    `per_second` sends on average, at most `burst` at once (None: one second's)."""

    per_second: float
    burst: float | None = None

    def __post_init__(self) -> None:
        if not self.per_second > 0 or (self.burst is not None and self.burst < 1):
            raise ValueError("a quota's per_second must be positive and its burst at least 1")

    @property
    def bucket(self) -> float:
        return self.burst if self.burst is not None else max(1.0, self.per_second)


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaSettings:
    """Provider quotas, by the quota's name (a sender's `quota_name`, e.g.
    `apns:com.example.app`, or its `name`, e.g. `fcm`), from IW_PROVIDER_QUOTAS: a JSON
    object of a number (per second) or `{"per_second": N, "burst": M}` per name."""

    limits: Mapping[str, ProviderQuota] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> QuotaSettings:
        text = env.get("IW_PROVIDER_QUOTAS", "").strip()
        if not text:
            return cls()
        try:
            given = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"IW_PROVIDER_QUOTAS is not JSON: {exc}") from None
        if not isinstance(given, dict):
            raise ValueError("IW_PROVIDER_QUOTAS: a JSON object of quotas by name")
        return cls(limits={str(name): _quota(name, value) for name, value in given.items()})


def _quota(name: str, value: Any) -> ProviderQuota:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return ProviderQuota(per_second=float(value))
    if isinstance(value, dict) and set(value) <= {"per_second", "burst"} and "per_second" in value:
        burst = value.get("burst")
        return ProviderQuota(
            per_second=float(value["per_second"]),
            burst=None if burst is None else float(burst),
        )
    raise ValueError(f'IW_PROVIDER_QUOTAS[{name!r}]: a number, or {{"per_second": N, "burst": M}}')


def _json_ints(env: Mapping[str, str], name: str) -> dict[str, int]:
    text = env.get(name, "").strip()
    if not text:
        return {}
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{name} is not JSON: {exc}") from None
    if not isinstance(given, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in given.values()
    ):
        raise ValueError(f"{name}: a JSON object of whole numbers by tenant")
    return {str(k): int(v) for k, v in given.items()}
