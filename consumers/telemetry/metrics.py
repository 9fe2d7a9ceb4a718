"""Prometheus metrics: what a worker counts, under one prefix, labelled by consumer.

Every name starts with `idempotent_workers_`; counters end in `_total`,
durations are in `_seconds`. The label `consumer` is the queue name (a
handful per app); tenants are never a label (unbounded). What no other
queue framework exports, per consumer: the duplicates we absorbed
(`outcome="duplicate_ignored"`) and the keys reused for another body
(`outcome="message_id_reused"`).

    idempotent_workers_messages_total{consumer,outcome,reason}   every settled delivery
    idempotent_workers_batch_messages{consumer}                  histogram: batch sizes
    idempotent_workers_batch_commit_seconds{consumer}            histogram: BEGIN to COMMIT
                                                                 returned (re-runs included)
    idempotent_workers_handler_seconds{consumer}                 histogram: one handler call
    idempotent_workers_deliveries_in_flight{consumer}            delivered, not yet settled
    idempotent_workers_acks_failed_total{consumer}               committed, ack lost: redelivered
    idempotent_workers_database_stalls_total{consumer}           batch held, database unreachable
    idempotent_workers_effects_total{consumer,kind,provider,outcome}
                                                                 external effects' answers
                                                                 recorded (sent, found, failed,
                                                                 invalid_token, deferred, unknown)
    idempotent_workers_sends_resent_total{consumer}              sent again, outcome unknown
    idempotent_workers_leases_taken_over_total{consumer}         a crashed sender's expired lease
    idempotent_workers_provider_circuit_open{consumer,provider}  1: paused, credentials refused
    idempotent_workers_provider_quota_per_second{quota}          a fleet quota's rate (the limit)
    idempotent_workers_provider_quota_sends_total{quota}         its tokens used (its use)
    idempotent_workers_provider_quota_wait_seconds{quota}        histogram: a send's wait for one
    idempotent_workers_provider_quota_pauses_total{quota}        Retry-After pauses written
    idempotent_workers_ready                                     processes ready (see health)
    idempotent_workers_heartbeat_timestamp_seconds               the event loop's last beat
    idempotent_workers_dedupe_rows                               processed_messages, estimated
    idempotent_workers_dedupe_oldest_claim_age_seconds           its oldest row's age
    idempotent_workers_outbox_pending                            outbox rows not yet published
    idempotent_workers_relay_lag_seconds                         the oldest pending row's age

The last four are read from PostgreSQL when scraped (`DedupeCollector`).

Cost: recorded per batch (a counter incremented by n), not per message,
except the handler histogram (one observation per handler call).

Several processes (`run --processes N`): the supervisor hands its children a
PROMETHEUS_MULTIPROC_DIR; prometheus-client then keeps each process's values
in files there (chosen when prometheus_client is first imported: the library
reads that variable itself), and the supervisor's scrape adds them up. The
gauges say how they add up (`multiprocess_mode`); a dead child's counters
stay counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from consumers.message.verdict import Outcome
from dedupe import OUTBOX_COUNT_CAP, TableStats

log = structlog.get_logger(__name__)

PREFIX = "idempotent_workers_"
# Reasons come from code (ours and the handlers' Reject/Retry), so they are
# few; past this many distinct ones in a process, the rest count as "other".
MAX_REASONS = 64
OTHER_REASON = "other"

BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
HANDLER_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)


class Metrics:
    """The worker's metric objects, on a registry of their own (several workers may
    share a process, as in the bench)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.messages = Counter(
            PREFIX + "messages",
            "Deliveries settled, by outcome (the log event name) and reason.",
            ["consumer", "outcome", "reason"],
            registry=r,
        )
        self.batch_messages = Histogram(
            PREFIX + "batch_messages",
            "Deliveries per batch (one transaction, one ack).",
            ["consumer"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_commit_seconds = Histogram(
            PREFIX + "batch_commit_seconds",
            "From BEGIN to COMMIT returned, re-runs after a lost connection included.",
            ["consumer"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.handler_seconds = Histogram(
            PREFIX + "handler_seconds",
            "One handler call (a batch handler's call counts once).",
            ["consumer"],
            buckets=HANDLER_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            PREFIX + "deliveries_in_flight",
            "Deliveries received and not yet settled (sampled at batch boundaries).",
            ["consumer"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.acks_failed = Counter(
            PREFIX + "acks_failed",
            "Deliveries whose ack failed after their batch committed (redelivered, then"
            " acked as duplicates).",
            ["consumer"],
            registry=r,
        )
        self.database_stalls = Counter(
            PREFIX + "database_stalls",
            "Times a batch was held and re-run because the database connection was lost.",
            ["consumer"],
            registry=r,
        )
        self.effects = Counter(
            PREFIX + "effects",
            "External effects' answers recorded, by kind (push, webhook, email, an API's),"
            " provider and outcome.",
            ["consumer", "kind", "provider", "outcome"],
            registry=r,
        )
        self.sends_resent = Counter(
            PREFIX + "sends_resent",
            "Sends made again after an unknown outcome (same ids: collapsed, deduped, replayed"
            " or looked up first).",
            ["consumer"],
            registry=r,
        )
        self.leases_taken_over = Counter(
            PREFIX + "leases_taken_over",
            "Send leases of a crashed worker taken over after they expired.",
            ["consumer"],
            registry=r,
        )
        self.circuit_open = Gauge(
            PREFIX + "provider_circuit_open",
            "1 while a provider's circuit is open or probing (our credentials refused).",
            ["consumer", "provider"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.quota_per_second = Gauge(
            PREFIX + "provider_quota_per_second",
            "A provider quota the fleet keeps together: its sends a second (the limit).",
            ["quota"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.quota_sends = Counter(
            PREFIX + "provider_quota_sends",
            "Sends made under a fleet provider quota (its tokens used).",
            ["quota"],
            registry=r,
        )
        self.quota_wait_seconds = Histogram(
            PREFIX + "provider_quota_wait_seconds",
            "How long a send waited for its fleet provider quota's token.",
            ["quota"],
            buckets=(0.0, *SECONDS_BUCKETS),
            registry=r,
        )
        self.quota_pauses = Counter(
            PREFIX + "provider_quota_pauses",
            "Pauses of a fleet provider quota this process wrote (a provider's Retry-After).",
            ["quota"],
            registry=r,
        )
        self.ready = Gauge(
            PREFIX + "ready",
            "1 per worker process that is connected to both services and consuming.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.commits_unreplicated = Gauge(
            PREFIX + "database_commits_unreplicated",
            "1 when the primary has standbys and its commits wait for none (read at start).",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.heartbeat = Gauge(
            PREFIX + "heartbeat_timestamp_seconds",
            "Unix time of the event loop's last beat (the stalest live process's).",
            multiprocess_mode="livemin",
            registry=r,
        )
        self._consumers: dict[str, ConsumerMetrics] = {}

    def consumer(self, name: str) -> ConsumerMetrics:
        """The metrics of one consumer, their label children bound once."""
        found = self._consumers.get(name)
        if found is None:
            found = self._consumers[name] = ConsumerMetrics(self, name)
        return found


class ConsumerMetrics:
    """One consumer's children of the metrics above; the runners call these."""

    def __init__(self, metrics: Metrics, consumer: str) -> None:
        self._metrics = metrics
        self.consumer = consumer
        self._reasons: dict[tuple[Outcome, str], Counter] = {}
        self.batch_messages = metrics.batch_messages.labels(consumer)
        self.commit_seconds = metrics.batch_commit_seconds.labels(consumer)
        self.handler_seconds = metrics.handler_seconds.labels(consumer)
        self.in_flight = metrics.in_flight.labels(consumer)
        self._acks_failed = metrics.acks_failed.labels(consumer)
        self._stalls = metrics.database_stalls.labels(consumer)
        self._resent = metrics.sends_resent.labels(consumer)
        self._taken_over = metrics.leases_taken_over.labels(consumer)

    def settled(self, tally: Mapping[tuple[Outcome, str], int]) -> None:
        """A batch's outcomes: `(outcome, reason) -> deliveries`."""
        for key, n in tally.items():
            child = self._reasons.get(key)
            if child is None:
                child = self._child(*key)
            child.inc(n)

    def _child(self, outcome: Outcome, reason: str) -> Counter:
        label = reason if len(self._reasons) < MAX_REASONS else OTHER_REASON
        child = self._metrics.messages.labels(self.consumer, str(outcome), label)
        if label == reason:
            self._reasons[(outcome, reason)] = child
        return child

    def acks_failed(self, deliveries: int) -> None:
        self._acks_failed.inc(deliveries)

    def database_stalled(self) -> None:
        self._stalls.inc()

    def effects(self, kind: str, provider: str, outcomes: Mapping[str, int]) -> None:
        for outcome, n in outcomes.items():
            self._metrics.effects.labels(self.consumer, kind, provider, outcome).inc(n)

    def resent(self, sends: int) -> None:
        if sends:
            self._resent.inc(sends)

    def taken_over(self, leases: int) -> None:
        if leases:
            self._taken_over.inc(leases)


class DedupeCollector(Collector):
    """Reads the dedupe and outbox tables' figures when scraped.

    `read()` runs in the scraping thread and returns None when the database
    does not answer in time: the scrape then lacks these two, rather than failing.
    """

    def __init__(self, read: Callable[[], TableStats | None]) -> None:
        self._read = read

    def collect(self) -> Iterable[GaugeMetricFamily]:
        try:
            reading = self._read()
        except Exception as exc:
            log.warning("dedupe_metrics_unavailable", error=f"{type(exc).__name__}: {exc}")
            return []
        if reading is None:
            return []
        families = [
            GaugeMetricFamily(
                PREFIX + "dedupe_rows",
                "Rows in processed_messages (pg_class.reltuples: an estimate).",
                value=reading.rows,
            )
        ]
        families.append(
            GaugeMetricFamily(
                PREFIX + "outbox_pending",
                f"Outbox rows not yet published (counted up to {OUTBOX_COUNT_CAP}).",
                value=reading.outbox_pending,
            )
        )
        families.append(
            GaugeMetricFamily(
                PREFIX + "relay_lag_seconds",
                "Age of the oldest outbox row not yet published (0: none pending).",
                value=reading.outbox_lag_seconds,
            )
        )
        if reading.oldest_age_seconds is not None:
            families.append(
                GaugeMetricFamily(
                    PREFIX + "dedupe_oldest_claim_age_seconds",
                    "Age of the oldest row of processed_messages (retention at work).",
                    value=reading.oldest_age_seconds,
                )
            )
        return families


def metric_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name `registry` exposes (for the dashboard's check)."""
    return {s.name for family in registry.collect() for s in family.samples}
