"""A target called before is sent as its channel allows: replayed within the window only,
looked up first, never a second call the provider would take as new.

The sender here is a stand-in for a provider that keeps what it created by key
(`KeyedProvider`): it answers as scripted, and, like Stripe, a call with a key it
created replays the first answer; like Svix, it can be asked by key. Every call
and lookup is counted, so a test sees what reached the provider.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Self

import asyncpg
import pytest

from consumers import (
    App,
    ConfigurationError,
    DeadTarget,
    InvalidJob,
    Recipient,
    RetryPolicy,
    Settings,
)
from dedupe import DbConnection
from providers import (
    LOOKUP_BY_KEY,
    NEITHER,
    ProviderReceipt,
    Recovery,
    SendIds,
    UnknownOutcomeError,
    replays_within,
)
from tests.harness import Harness
from tests.support import wait_for

# The first retry comes back after a second: longer than SHORT_WINDOW.
SLOW_RETRY = RetryPolicy(max_attempts=3, base_seconds=1.0, tiers_seconds=(1.0,))
SHORT_WINDOW = 0.5
ANSWER_SECONDS = 0.1


@pytest.fixture
def retry_policy() -> RetryPolicy:
    return SLOW_RETRY


class CallKind:
    """Jobs `{"to": "..."}`, one call each, to the channel `calls`."""

    name = "call"

    def bound(self, pool: asyncpg.Pool, settings: Settings) -> Self:
        return self

    def parse(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        if not isinstance(body.get("to"), str):
            raise InvalidJob("to: a string")
        return body

    def weigh(self, body: bytes, *, max_body_bytes: int) -> int:
        return 1

    def collapse_key(self, job: Mapping[str, Any]) -> str | None:
        return None

    async def recipients(
        self, tx: DbConnection, jobs: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[list[Recipient]]:
        return [[Recipient(channel="calls", address=str(job["to"]))] for _, job in jobs]

    async def effect(
        self, job: Mapping[str, Any], index: int, recipient: Recipient, *, tenant: str
    ) -> object:
        return dict(job)

    async def gone(self, tx: DbConnection, dead: DeadTarget) -> None:
        pass


class KeyedProvider:
    """Creates one thing per key; scripted answers: `ok`, `lost_after` (created, the answer
    lost), `lost_before` (never reached it). A call with a key it created replays."""

    name = "keyed"
    answer_seconds = ANSWER_SECONDS
    max_in_flight = 10

    def __init__(self, recovery: Recovery, *script: str) -> None:
        self.recovery = recovery
        self.script = deque(script)
        self.created: dict[str, int] = {}  # key -> creations
        self.calls: list[str] = []
        self.lookups: list[str] = []

    async def send(
        self, effect: object, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        key = ids.effect_id
        self.calls.append(key)
        if key in self.created:  # a replay: the first answer again
            return ProviderReceipt(provider=self.name, provider_message_id=f"obj-{key}")
        answer = self.script.popleft() if self.script else "ok"
        if answer == "lost_before":
            raise UnknownOutcomeError("connection lost", provider=self.name)
        self.created[key] = self.created.get(key, 0) + 1
        if answer == "lost_after":
            raise UnknownOutcomeError("timeout after the request was written", provider=self.name)
        return ProviderReceipt(provider=self.name, provider_message_id=f"obj-{key}")

    async def look_up(
        self, effect: object, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt | None:
        self.lookups.append(ids.effect_id)
        if ids.effect_id in self.created:
            return ProviderReceipt(provider=self.name, provider_message_id=f"obj-{ids.effect_id}")
        return None

    async def aclose(self) -> None:
        pass


def calls_app(queue: str, provider: KeyedProvider) -> App:
    app = App(retry=SLOW_RETRY)

    async def build() -> KeyedProvider:
        return provider

    app.effect_handler(queue, kind=CallKind(), provider=build, lease_seconds=5.0)
    return app


async def ledger_row(harness: Harness) -> asyncpg.Record:
    row = await harness.db.fetchrow(
        "SELECT status, sends, provider_message_id, failure_reason FROM send_ledger"
    )
    assert row is not None
    return row


async def wait_settled(harness: Harness) -> asyncpg.Record:
    async def settled() -> bool:
        row = await harness.db.fetchrow("SELECT status FROM send_ledger")
        return row is not None and row["status"] in ("sent", "failed")

    await wait_for(settled, timeout=30)
    return await ledger_row(harness)


async def test_channel_that_replays_by_key_is_called_again_within_its_window_and_creates_once(
    harness: Harness,
) -> None:
    provider = KeyedProvider(replays_within(3600), "lost_after")
    async with harness.run(calls_app(harness.queue, provider)):
        await harness.publish({"to": "acct-1"}, message_id="charge-1")
        row = await wait_settled(harness)
    assert row["status"] == "sent" and row["sends"] == 2
    assert len(provider.calls) == 2 and len(set(provider.calls)) == 1  # the same key twice
    assert list(provider.created.values()) == [1]  # replayed, not created again


async def test_channel_that_replays_by_key_is_never_called_past_its_window(
    harness: Harness,
) -> None:
    provider = KeyedProvider(replays_within(SHORT_WINDOW), "lost_after")
    async with harness.run(calls_app(harness.queue, provider)):
        await harness.publish({"to": "acct-1"}, message_id="charge-late")
        row = await wait_settled(harness)
        await harness.wait_outcome("effect_committed")
    assert row["status"] == "failed"
    assert row["failure_reason"] == "unknown_outcome: replay_window_passed"
    assert len(provider.calls) == 1  # the retry came after the window: no second call
    assert "call_failed" in harness.outcomes()


async def test_channel_that_can_be_asked_is_asked_first_and_not_called_again(
    harness: Harness,
) -> None:
    provider = KeyedProvider(LOOKUP_BY_KEY, "lost_after")
    async with harness.run(calls_app(harness.queue, provider)):
        await harness.publish({"to": "acct-1"}, message_id="event-1")
        row = await wait_settled(harness)
    assert row["status"] == "sent" and row["provider_message_id"].startswith("obj-")
    assert len(provider.calls) == 1 and len(provider.lookups) == 1
    found = [e for e in harness.logs if e["event"] == "call_sent" and e.get("found_by_lookup")]
    assert len(found) == 1


async def test_channel_that_can_be_asked_calls_again_when_the_first_call_never_arrived(
    harness: Harness,
) -> None:
    provider = KeyedProvider(LOOKUP_BY_KEY, "lost_before")
    async with harness.run(calls_app(harness.queue, provider)):
        await harness.publish({"to": "acct-1"}, message_id="event-2")
        row = await wait_settled(harness)
    assert row["status"] == "sent"
    assert len(provider.lookups) == 1 and len(provider.calls) == 2
    assert list(provider.created.values()) == [1]


async def test_channel_that_offers_neither_is_sent_again_with_the_same_key(
    harness: Harness,
) -> None:
    provider = KeyedProvider(NEITHER, "lost_after")
    async with harness.run(calls_app(harness.queue, provider)):
        await harness.publish({"to": "acct-1"}, message_id="mail-1")
        row = await wait_settled(harness)
    assert row["status"] == "sent" and provider.lookups == []
    assert len(provider.calls) == 2 and len(set(provider.calls)) == 1


async def test_a_sender_declaring_lookup_without_a_look_up_method_is_refused_at_start(
    harness: Harness,
) -> None:
    class Mute:
        name = "mute"
        answer_seconds = ANSWER_SECONDS
        max_in_flight = 1
        recovery = LOOKUP_BY_KEY

        async def send(self, effect: object, ids: SendIds, *, deadline: float | None = None) -> Any:
            raise AssertionError("never called")

        async def aclose(self) -> None:
            pass

    app = App(retry=SLOW_RETRY)

    async def build() -> Mute:
        return Mute()

    app.effect_handler(harness.queue, kind=CallKind(), provider=build, lease_seconds=5.0)
    worker = harness.run(app)
    with pytest.raises(ConfigurationError, match="offers lookup by key"):
        try:
            await worker.start()
        finally:
            await worker.stop()
