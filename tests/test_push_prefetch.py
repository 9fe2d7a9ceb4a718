"""A push queue's channels take `push_prefetch` deliveries, not `prefetch`.

A push job keeps its delivery unacked for the provider's round trip and the
ledger's two steps, so a push queue needs a wider window than a queue of local
effects for the same rate (issue 25: at 1,000 the one-device push bench waited
on the window, with every batch slot busy and the buffer not empty). Read from
the broker: with every send held, the deliveries the worker took are those the
queue no longer has ready.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from consumers import App, Settings, push_job_body
from providers import Platform, Provider, ProviderReceipt, Push, RecordingProvider, SendIds, Target
from tests.apps.push_app import FAST_RETRY
from tests.harness import Harness
from tests.support import wait_for

JOBS = 30
PREFETCH = 2  # the local-effect queues' window: were it used, 28 would stay ready
PUSH_PREFETCH = 10


class HeldProvider(RecordingProvider):
    """Answers no send until `release()`: every job it was given stays unacked."""

    def __init__(self) -> None:
        super().__init__()
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        await self._released.wait()
        return await super().send(push, ids, deadline=deadline)


async def test_a_push_queue_holds_push_prefetch_deliveries(harness: Harness) -> None:
    held = HeldProvider()
    app = App(retry=FAST_RETRY)

    async def provider() -> Provider:
        return held

    app.push_handler(harness.queue, provider=provider)
    worker = replace(harness.settings.worker, prefetch=PREFETCH, push_prefetch=PUSH_PREFETCH)
    async with harness.run(app, replace(harness.settings, worker=worker)):
        try:
            for n in range(JOBS):
                target = Target(platform=Platform.IOS, token=f"window-{n:03d}")
                await harness.publish(
                    push_job_body(targets=[target], title="Sale", body="Today only"),
                    message_id=f"window-{n}",
                )

            async def window_taken() -> bool:
                return await harness.ready_count() <= JOBS - PUSH_PREFETCH

            await wait_for(window_taken, timeout=10.0)
            # Nothing is acked before its send is answered: the window stays where it is.
            assert await harness.ready_count() == JOBS - PUSH_PREFETCH
        finally:
            held.release()  # else the worker's stop waits out its grace on held sends
        await harness.wait_outcome("effect_committed", JOBS)
    assert sorted(s.push.target.token for s in held.sends) == [
        f"window-{n:03d}" for n in range(JOBS)
    ]


def test_the_push_window_is_read_from_the_environment_and_refuses_zero() -> None:
    assert Settings.from_env({}).worker.push_prefetch == 2_000
    assert Settings.from_env({"IW_PUSH_PREFETCH": "300"}).worker.push_prefetch == 300
    for name in ("IW_PUSH_PREFETCH", "IW_PREFETCH"):
        with pytest.raises(ValueError, match="prefetch"):
            Settings.from_env({name: "0"})
