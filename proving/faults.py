"""A `Faults` that SIGKILLs its own process at a named point: for crash tests and chaos.

    app = App(faults=SigkillAt.from_env(os.environ))

`PROVING_CRASH_AT` names the point (`before_commit`, `after_commit`,
`after_send`) and `PROVING_CRASH_AFTER` how many passes of it go by first
(0: the first). Read here, by the apps that opt in, never by the framework.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

import structlog

from consumers import NO_FAULTS, CrashPoint, Faults

log = structlog.get_logger(__name__)

CRASH_AT = "PROVING_CRASH_AT"
CRASH_AFTER = "PROVING_CRASH_AFTER"


class SigkillAt:
    """Kill this process with SIGKILL the `after`+1-th time `point` is reached."""

    def __init__(self, point: CrashPoint, *, after: int = 0) -> None:
        self.point = point
        self.after = after
        self.passed = 0

    def reached(self, point: CrashPoint) -> None:
        if point is not self.point:
            return
        if self.passed >= self.after:
            log.warning("crash_injected", point=str(point), passed=self.passed)
            os.kill(os.getpid(), signal.SIGKILL)
        self.passed += 1

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Faults:
        """`SigkillAt` as `PROVING_CRASH_AT` and `PROVING_CRASH_AFTER` say; no faults if unset."""
        point = env.get(CRASH_AT)
        if not point:
            return NO_FAULTS
        return cls(CrashPoint(point), after=int(env.get(CRASH_AFTER, "0")))
