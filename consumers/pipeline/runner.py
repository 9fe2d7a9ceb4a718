"""The seam between a batch loop and what runs its batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from consumers.handlers.spec import HandlerSpec
from consumers.pipeline.acks import AckWindow
from consumers.pipeline.deliveries import Delivery
from consumers.pipeline.settle import Dispatcher


class Runner(Protocol):
    """Decides, commits and acknowledges every delivery of a batch.

    `BatchRunner` (local effects) and `EffectsRunner` (the send ledger) meet it.
    `run` settles every delivery it is given through `dispatcher`, or raises:
    then `consumers.pipeline.isolation` finds the message the framework cannot decide.
    `acks`: the channel's ack window when the runner settles out of delivery
    order (None: a batch's multiple ack covers it).
    `started`: called once the batch no longer needs to hold the next one back
    (`consumers.pipeline.loop`; a push batch: its first answers recorded). The
    loop calls it anyway once `run` returns; calling it again does nothing.
    """

    @property
    def spec(self) -> HandlerSpec: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def acks(self) -> AckWindow | None: ...

    async def run(self, deliveries: Sequence[Delivery], started: Callable[[], None]) -> None: ...

    async def close(self) -> None:
        """Give back what the runner keeps between batches (the loop has ended)."""
        ...
