"""Fault injection as a seam: where a crash test or the chaos suite may kill a worker.

The runners call `faults.reached(point)` at each point below; the default,
`NO_FAULTS`, does nothing. Only the crash tests and the chaos app install
another `Faults` (see `proving.faults.SigkillAt`), through `App(faults=...)`:
no setting, no environment variable, nothing in production reads one.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class CrashPoint(StrEnum):
    """Named points on the guarantee's path, in the order a batch passes them."""

    BEFORE_COMMIT = "before_commit"  # handlers ran, the transaction is not committed
    AFTER_COMMIT = "after_commit"  # committed, not yet acknowledged
    AFTER_SEND = "after_send"  # the provider answered; its answer is not yet committed
    AFTER_PUBLISH = "after_publish"  # the relay's batch is confirmed, not yet marked published


class Faults(Protocol):
    def reached(self, point: CrashPoint) -> None:
        """Called each time a runner passes `point`; may end the process."""


class NoFaults:
    """The production default: nothing happens at any point."""

    def reached(self, point: CrashPoint) -> None:
        return None


NO_FAULTS: Faults = NoFaults()
