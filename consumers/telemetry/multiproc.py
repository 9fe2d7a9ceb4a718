"""A supervisor's view of its children: their metrics added up, their health.

Each child keeps its metric values in files under PROMETHEUS_MULTIPROC_DIR
(prometheus-client's multiprocess mode); `MultiProcessCollector` adds them
up when scraped, counters of dead children included (a restart does not
reset a total). The children's health arrives the same way, in two gauges
(`consumers.telemetry.health`): `idempotent_workers_ready` (summed over live
children) and `idempotent_workers_heartbeat_timestamp_seconds` (the
stalest live child's). A child's live gauges are dropped when it is reaped
(`mark_dead`).

- live: the supervisor's own loop beats, and no running child's beat is older
  than LIVE_WITHIN_SECONDS (a child not yet beating does not count against it);
- ready: every one of the N children is running and reports ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from consumers.telemetry.health import LIVE_WITHIN_SECONDS, Status
from consumers.telemetry.metrics import PREFIX

READY = PREFIX + "ready"
HEARTBEAT = PREFIX + "heartbeat_timestamp_seconds"


def prepare(directory: Path) -> None:
    """Empty the directory of a previous run's files (the library requires it)."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()


def mark_dead(directory: Path, pid: int) -> None:
    """Drop a reaped child's live gauges; its counters stay counted."""
    multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


def children_registry(directory: Path, *extra: Collector) -> CollectorRegistry:
    """What the supervisor serves: the children's metrics added up, and `extra`."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    for collector in extra:
        registry.register(collector)
    return registry


class ChildrenHealth:
    """The HealthView of a supervisor: its own beat and its children's gauges."""

    def __init__(
        self,
        directory: Path,
        *,
        expected: int,
        running: Callable[[], int],
        own_beat: Callable[[], float],
    ) -> None:
        self._collector = multiprocess.MultiProcessCollector(  # type: ignore[no-untyped-call]
            None, path=str(directory)
        )
        self._expected = expected
        self._running = running
        self._own_beat = own_beat

    def _gauges(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for family in self._collector.collect():  # type: ignore[no-untyped-call]
            for sample in family.samples:
                if sample.name in (READY, HEARTBEAT):
                    values[sample.name] = sample.value
        return values

    def liveness(self) -> Status:
        now = time.time()
        own = now - self._own_beat()
        if own >= LIVE_WITHIN_SECONDS:
            return Status(ok=False, detail=f"supervisor loop answered {own:.1f} s ago")
        stalest = self._gauges().get(HEARTBEAT)
        if stalest is not None and now - stalest >= LIVE_WITHIN_SECONDS:
            return Status(
                ok=False, detail=f"a worker's event loop answered {now - stalest:.1f} s ago"
            )
        return Status(ok=True, detail=f"supervisor and {self._running()} worker(s) answering")

    def readiness(self) -> Status:
        running = self._running()
        ready = int(self._gauges().get(READY, 0))
        ok = running == self._expected and ready >= self._expected
        return Status(
            ok=ok, detail=f"{ready} of {self._expected} worker processes ready ({running} running)"
        )


class SupervisorCollector(Collector):
    """The supervisor's own figures, made when scraped (never in the children's files)."""

    def __init__(self, *, restarts: Callable[[], int], running: Callable[[], int]) -> None:
        self._restarts = restarts
        self._running = running

    def collect(self) -> Iterable[Metric]:
        restarts = CounterMetricFamily(
            PREFIX + "process_restarts", "Worker processes restarted after dying unasked."
        )
        restarts.add_metric([], self._restarts())
        running = GaugeMetricFamily(
            PREFIX + "processes", "Worker processes running under the supervisor."
        )
        running.add_metric([], self._running())
        return [restarts, running]
