"""Issue 56: an effects loop takes its buffer by tenant, in turn, and past a job that does not
fit; the holding keeps room for tenants holding nothing and each tenant's own limit."""

from __future__ import annotations

from typing import Any, cast

import pytest

from consumers import Settings, TenantSettings
from consumers.pipeline.deliveries import Delivery
from consumers.pipeline.holding import Holding
from consumers.pipeline.tenants import TenantBuffer, tenant_of


class Stub:
    """A delivery as the buffer and the holding read it: headers and a weight."""

    def __init__(self, tenant: str | bytes | None, weight: int, name: str) -> None:
        self.headers: dict[str, Any] = {} if tenant is None else {"x-tenant": tenant}
        self.weight = weight
        self.name = name

    def __repr__(self) -> str:
        return self.name


def delivery(tenant: str | bytes | None, weight: int, name: str) -> Delivery:
    return cast(Delivery, Stub(tenant, weight, name))


def weigh(d: Delivery) -> int:
    return cast(Stub, d).weight


def names(deliveries: list[Delivery]) -> list[str]:
    return [cast(Stub, d).name for d in deliveries]


def take(buffer: TenantBuffer, holding: Holding, most: int = 500) -> list[str]:
    def admit(d: Delivery, weight: int, tenant: str) -> bool:
        if not holding.admits(weight, tenant):
            return False
        holding.take(d, weight, tenant)
        return True

    return names(buffer.take(most, admit))


def fill(buffer: TenantBuffer, *entries: tuple[str, int, str]) -> None:
    for tenant, weight, name in entries:
        buffer.append((delivery(tenant, weight, name), weight))


def test_a_take_goes_round_the_tenants_one_each_in_turn_each_tenants_in_order() -> None:
    buffer = TenantBuffer()
    fill(buffer, *(("a", 1, f"a{n}") for n in range(4)), ("b", 1, "b0"), ("b", 1, "b1"))
    fill(buffer, ("c", 1, "c0"))
    holding = Holding(limit=100, weigh=weigh)
    assert take(buffer, holding, most=5) == ["a0", "b0", "c0", "a1", "b1"]
    assert take(buffer, holding) == ["a2", "a3"]
    assert len(buffer) == 0


def test_a_tenants_job_too_heavy_for_now_is_passed_over_for_the_next_tenants() -> None:
    """A's parts fill the limit; B's one-device job, behind them in the buffer, is taken
    (the reserve), and A's next part waits with everything of A's behind it."""
    buffer = TenantBuffer()
    fill(buffer, *(("a", 200, f"a{n}") for n in range(8)), ("b", 1, "b0"), ("a", 1, "a-small"))
    holding = Holding(limit=1_000, weigh=weigh, reserve=100)
    assert take(buffer, holding) == ["a0", "b0", "a1", "a2", "a3"]
    assert holding.held == 801 and holding.held_by("a") == 800
    assert take(buffer, holding) == []  # a4 waits; a-small stays behind it (A's order)
    fill(buffer, ("c", 150, "c0"))
    assert take(buffer, holding) == ["c0"]  # within the limit and the reserve: 951


def test_the_reserve_is_for_tenants_holding_less_than_the_most_and_bounds_what_is_held() -> None:
    holding = Holding(limit=1_000, weigh=weigh, reserve=100)
    a0 = delivery("a", 1_000, "a0")
    holding.take(a0, 1_000, "a")
    assert not holding.light("a") and holding.light("b")
    assert not holding.admits(1, "a")  # the tenant holding the most waits
    assert holding.admits(100, "b") and not holding.admits(101, "b")  # limit + reserve
    holding.take(delivery("b", 60, "b0"), 60, "b")
    assert holding.light("b") and holding.admits(40, "b")  # still less than A's
    assert holding.admits(40, "c") and not holding.admits(41, "c")
    holding.release([a0])  # A settles: B holds the most now, and the limit has room
    assert not holding.light("b") and holding.light("a")
    assert holding.admits(940, "b") and not holding.admits(941, "b")


def test_a_job_larger_than_every_limit_goes_alone_and_each_tenant_keeps_its_own_limit() -> None:
    holding = Holding(
        limit=1_000, weigh=weigh, reserve=0, tenant_limit=300, tenant_limits={"big": 2_000}
    )
    assert holding.tenant_limit("a") == 300 and holding.tenant_limit("big") == 2_000
    assert holding.admits(5_000, "a")  # nothing held: alone
    holding.take(delivery("a", 200, "a0"), 200, "a")
    assert holding.admits(100, "a") and not holding.admits(101, "a")  # A's own 300
    assert holding.admits(800, "big") and not holding.admits(801, "big")  # the queue's 1,000
    a1 = delivery("a", 100, "a1")
    holding.take(a1, 100, "a")
    holding.release([a1, a1])  # twice counts once
    assert holding.held_by("a") == 200 and holding.held == 200


def test_a_tenant_header_is_read_as_text_and_the_absent_one_is_the_empty_tenant() -> None:
    assert tenant_of(delivery(None, 1, "x")) == ""
    assert tenant_of(delivery("acme", 1, "x")) == "acme"
    assert tenant_of(delivery(b"acme", 1, "x")) == "acme"
    assert tenant_of(delivery(b"\xff", 1, "x")) == "\ufffd"


def test_the_tenant_settings_are_read_from_the_environment() -> None:
    assert Settings.from_env({}).tenants == TenantSettings()
    read = Settings.from_env(
        {
            "IW_TENANT_HELD_DEVICES": "2000",
            "IW_TENANT_HELD_DEVICES_BY_TENANT": '{"acme": 20000, "tiny": 50}',
            "IW_TENANT_RESERVED_DEVICES": "0",
            "IW_PUSH_BULK_PREFETCH": "30",
        }
    )
    assert read.tenants == TenantSettings(
        held_devices=2_000, held_devices_by_tenant={"acme": 20_000, "tiny": 50}, reserved_devices=0
    )
    assert read.worker.bulk_prefetch == 30
    assert Settings.from_env({"IW_PUSH_HELD_DEVICES": "1000"}).worker.bulk_prefetch == 15
    with pytest.raises(ValueError, match="IW_TENANT_HELD_DEVICES_BY_TENANT"):
        Settings.from_env({"IW_TENANT_HELD_DEVICES_BY_TENANT": '{"acme": "many"}'})
    with pytest.raises(ValueError, match="at least 1"):
        Settings.from_env({"IW_TENANT_HELD_DEVICES_BY_TENANT": '{"acme": 0}'})
