"""Configuration objects, grouped by concern.

Environment variables are read in one place, `from_env()`, which the CLI
calls; nothing here reads the environment at import time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

from consumers.fleet import QuotaSettings, TenantSettings

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# The largest message body a worker decodes (IW_MAX_BODY_BYTES); the send API
# refuses a larger body at the door (ingress reads the same variable).
MAX_BODY_BYTES = 1_048_576
# The targets of one part of a send in the bulk lane (dedupe.PART_TARGETS).
BULK_PART_TARGETS = 200


class QueueType(StrEnum):
    QUORUM = "quorum"
    CLASSIC = "classic"


def parse_urls(text: str) -> tuple[str, ...]:
    """`AMQP_URL`'s addresses: one URL, or several separated by commas."""
    urls = tuple(part.strip() for part in text.split(",") if part.strip())
    if not urls:
        raise ValueError(f"no broker address in {text!r}")
    return urls


@dataclass(frozen=True, slots=True, kw_only=True)
class AmqpSettings:
    # The broker's addresses: one node, or the nodes of a cluster in the order
    # this process tries them (give each worker its own order to spread them).
    urls: tuple[str, ...] = (DEFAULT_AMQP_URL,)
    queue_type: QueueType = QueueType.QUORUM
    # Deliveries of one message before the broker dead-letters it: catches a
    # message that kills the process itself, which no handler can record.
    delivery_limit: int = 20

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("AmqpSettings needs at least one broker address")

    @property
    def url(self) -> str:
        """The first address: for tools that talk to one node at a time."""
        return self.urls[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class DatabaseSettings:
    url: str = DEFAULT_DATABASE_URL
    schema: str = "public"  # where processed_messages lives; first on search_path
    pool_size: int = 4
    # Refuse to start (exit 78) on a primary whose standbys its commits do not
    # wait for: an ack there is lost by a failover (dedupe.replication).
    require_synchronous_replication: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    prefetch: int = 1000  # unacknowledged deliveries per channel
    # The same for a push queue's channels. A push job keeps its delivery for
    # the provider's round trip and the ledger's two steps (about 0.35 s at a
    # fake APNs's 20 ms), so the window must cover rate x that time: at 1,000
    # one-device jobs the worker waited on the window, not on work.
    push_prefetch: int = 2000
    # Devices of the push jobs a worker takes from one push queue's deliveries
    # and holds until they settle: memory follows this, not a send's size. A
    # job larger than it goes alone. About what FCM's 32 threads start in one
    # 30 s lease at 100 ms answers (consumers.pipeline.holding).
    push_held_devices: int = 10_000
    # Deliveries of an effects queue's bulk lane (the parts of sends of many targets,
    # `consumers.publishing.parts`) a worker takes before it has room for them: what
    # it holds plus a few, so the other parts stay in the queue for the other
    # workers. None: push_held_devices / 200 (a part's targets) + 10.
    push_bulk_prefetch: int | None = None
    max_batch: int = 500  # messages in one transaction at most
    concurrency: int = 1  # channels (and batches in flight) per queue
    max_body_bytes: int = MAX_BODY_BYTES
    shutdown_grace_seconds: float = 30.0
    # A handler's deadline (`@app.handler(q, timeout=...)` overrides it): past
    # it the handler is cancelled, its message retried, the batch goes on.
    handler_timeout_seconds: float = 30.0
    # A loop stuck this long past the longest deadline (a handler blocking it)
    # ends the process (consumers.runtime.watchdog); also the sessions' backstop margin.
    watchdog_grace_seconds: float = 10.0
    # Web Push endpoint hosts a push job may name although private or loopback
    # (providers.webpush_subscription): for tests and demos only, never production.
    # IW_WEBPUSH_ALLOW_HOSTS, comma-separated; WebPushSettings.allow_hosts is the sender's.
    webpush_allow_hosts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.handler_timeout_seconds > 0 or not self.watchdog_grace_seconds > 0:
            raise ValueError("handler_timeout_seconds and watchdog_grace_seconds must be positive")
        if self.push_held_devices < 1:
            raise ValueError("push_held_devices must be at least 1")
        if self.prefetch < 1 or self.push_prefetch < 1:
            raise ValueError("prefetch and push_prefetch must be at least 1")
        if self.push_bulk_prefetch is not None and self.push_bulk_prefetch < 1:
            raise ValueError("push_bulk_prefetch must be at least 1")

    @property
    def bulk_prefetch(self) -> int:
        """The bulk lane's prefetch: `push_bulk_prefetch`, or what the held devices take
        in parts of 200, and 10 more."""
        if self.push_bulk_prefetch is not None:
            return self.push_bulk_prefetch
        return math.ceil(self.push_held_devices / BULK_PART_TARGETS) + 10


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionSettings:
    """How long dedupe rows live, and what must fit in that time (retention.retry_horizon)."""

    keep_days: float = 7.0  # claims, settled sends and the rest are dropped after this
    # How long after a message's last retry a dead letter may still be
    # replayed safely: retention must cover the retry horizon plus this.
    replay_window_days: float = 3.0
    cleanup_interval_seconds: float | None = None  # `run` cleans up this often; None: never
    # A generation is current this long; cleanup then rotates (dedupe.generations).
    generation_hours: float = 24.0

    @property
    def generation_span(self) -> timedelta:
        return timedelta(hours=self.generation_hours)

    @property
    def keep(self) -> timedelta:
        return timedelta(days=self.keep_days)

    @property
    def replay_window(self) -> timedelta:
        return timedelta(days=self.replay_window_days)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSettings:
    # /metrics, /healthz and /readyz on this port; None: not served (the default).
    port: int | None = None
    # Loopback: the endpoint has no authentication. A container that is probed or
    # scraped from outside sets 0.0.0.0 (IW_METRICS_HOST; deploy/ does).
    host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class RelaySettings:
    in_run: bool = False  # `run` relays the outbox too, beside its handlers
    batch_size: int = 500  # rows claimed (and published at once) per transaction
    concurrency: int = 4  # batches in flight per relay, each its own transaction
    poll_interval_s: float = 1.0  # look even without a NOTIFY this often

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.concurrency < 1 or self.poll_interval_s <= 0:
            raise ValueError("relay batch_size, concurrency and poll interval must be positive")


TRACE_EXPORTERS = ("otlp", "console")


@dataclass(frozen=True, slots=True, kw_only=True)
class TracingSettings:
    """Whether spans are made and exported (`consumers.telemetry.tracing`).

    Read from the standard OpenTelemetry variables only; the SDK reads the others
    (service name, resource, sampler, batch processor, OTLP endpoint) itself."""

    exporter: str | None = None  # otlp | console; None: off
    protocol: str = "http/protobuf"  # OTLP's; only http/protobuf is shipped

    @property
    def enabled(self) -> bool:
        return self.exporter is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TracingSettings:
        """On when OTEL_TRACES_EXPORTER names an exporter, or an OTLP endpoint is set;
        off with OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none."""
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return cls()
        named = [
            name.strip().lower()
            for name in env.get("OTEL_TRACES_EXPORTER", "").split(",")
            if name.strip()
        ]
        if "none" in named:
            return cls()
        unknown = [name for name in named if name not in TRACE_EXPORTERS]
        if unknown:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER: {', '.join(unknown)} is not one of otlp, console"
            )
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        exporter = named[0] if named else ("otlp" if endpoint else None)
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        return cls(exporter=exporter, protocol=protocol.strip().lower())


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookSettings:
    """Webhooks: how they are sent (`App.webhook_handler`) and their endpoints kept
    (`idempotent-workers webhook endpoint ...`).

    From the environment:
    `secrets_keys`      IW_WEBHOOK_SECRETS_KEY: Fernet keys, comma-separated; the first
                        encrypts the endpoints' signing secrets, every one decrypts (add
                        a new key first, drop an old one only once nothing uses it)
    `allow_http_hosts`  IW_WEBHOOK_ALLOW_HTTP_HOSTS: hosts an endpoint may reach over
                        plain http (tests, demos); every other endpoint is https
    `rotation_overlap_hours`  IW_WEBHOOK_ROTATION_OVERLAP_HOURS: how long an old secret
                        signs beside the new one after a rotation (default 24)
    In code only: the sender's timeouts and connections, and how long a worker keeps
    an endpoint's URL and secrets before reading them again.
    """

    secrets_keys: tuple[str, ...] = field(default=(), repr=False)
    allow_http_hosts: frozenset[str] = frozenset()
    rotation_overlap_hours: float = 24.0
    timeout_seconds: float = 15.0  # one call, start to answer (the spec: 15 to 30 s)
    connect_timeout_seconds: float = 5.0
    max_in_flight: int = 64  # calls at once per worker and queue: the connection pool
    endpoint_cache_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.rotation_overlap_hours < 0 or self.endpoint_cache_seconds < 0:
            raise ValueError("rotation_overlap_hours and endpoint_cache_seconds must be >= 0")
        if not 0 < self.connect_timeout_seconds <= self.timeout_seconds:
            raise ValueError("webhook timeouts must be positive, connect within the whole")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    amqp: AmqpSettings = field(default_factory=AmqpSettings)
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    relay: RelaySettings = field(default_factory=RelaySettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    tenants: TenantSettings = field(default_factory=TenantSettings)
    quotas: QuotaSettings = field(default_factory=QuotaSettings)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read AMQP_URL (comma-separated: a cluster), DATABASE_URL, DATABASE_SCHEMA, IW_*."""
        env = os.environ if env is None else env
        port = env.get("IW_METRICS_PORT", "")
        return cls(
            amqp=AmqpSettings(
                urls=parse_urls(env.get("AMQP_URL", DEFAULT_AMQP_URL)),
                queue_type=QueueType(env.get("IW_QUEUE_TYPE", QueueType.QUORUM)),
                delivery_limit=int(env.get("IW_DELIVERY_LIMIT", "20")),
            ),
            database=DatabaseSettings(
                url=env.get("DATABASE_URL", DEFAULT_DATABASE_URL),
                schema=env.get("DATABASE_SCHEMA", "public"),
                pool_size=int(env.get("IW_POOL_SIZE", "4")),
                require_synchronous_replication=env.get("IW_REQUIRE_SYNC_REPLICATION", "")
                in ("1", "true", "yes"),
            ),
            worker=WorkerSettings(
                prefetch=int(env.get("IW_PREFETCH", "1000")),
                push_prefetch=int(env.get("IW_PUSH_PREFETCH", "2000")),
                push_held_devices=int(env.get("IW_PUSH_HELD_DEVICES", "10000")),
                push_bulk_prefetch=(
                    int(env["IW_PUSH_BULK_PREFETCH"]) if env.get("IW_PUSH_BULK_PREFETCH") else None
                ),
                max_batch=int(env.get("IW_MAX_BATCH", "500")),
                concurrency=int(env.get("IW_CONCURRENCY", "1")),
                max_body_bytes=int(env.get("IW_MAX_BODY_BYTES", str(MAX_BODY_BYTES))),
                shutdown_grace_seconds=float(env.get("IW_SHUTDOWN_GRACE", "30")),
                handler_timeout_seconds=float(env.get("IW_HANDLER_TIMEOUT", "30")),
                watchdog_grace_seconds=float(env.get("IW_WATCHDOG_GRACE", "10")),
                webpush_allow_hosts=allow_hosts(env.get("IW_WEBPUSH_ALLOW_HOSTS", "")),
            ),
            retention=RetentionSettings(
                keep_days=float(env.get("IW_RETENTION_DAYS", "7")),
                replay_window_days=float(env.get("IW_REPLAY_WINDOW_DAYS", "3")),
                cleanup_interval_seconds=(
                    float(env["IW_CLEANUP_INTERVAL"]) if env.get("IW_CLEANUP_INTERVAL") else None
                ),
                generation_hours=float(env.get("IW_GENERATION_HOURS", "24")),
            ),
            metrics=MetricsSettings(
                port=int(port) if port else None,
                host=env.get("IW_METRICS_HOST", "127.0.0.1"),
            ),
            relay=RelaySettings(
                in_run=env.get("IW_RELAY", "0").lower() in ("1", "true", "yes"),
                batch_size=int(env.get("IW_RELAY_BATCH", "500")),
                concurrency=int(env.get("IW_RELAY_CONCURRENCY", "4")),
                poll_interval_s=float(env.get("IW_RELAY_POLL", "1")),
            ),
            tracing=TracingSettings.from_env(env),
            tenants=TenantSettings.from_env(env),
            quotas=QuotaSettings.from_env(env),
            webhooks=WebhookSettings(
                secrets_keys=_names(env.get("IW_WEBHOOK_SECRETS_KEY", "")),
                allow_http_hosts=frozenset(
                    host.lower() for host in _names(env.get("IW_WEBHOOK_ALLOW_HTTP_HOSTS", ""))
                ),
                rotation_overlap_hours=float(env.get("IW_WEBHOOK_ROTATION_OVERLAP_HOURS", "24")),
            ),
        )


def allow_hosts(text: str) -> frozenset[str]:
    """`IW_WEBPUSH_ALLOW_HOSTS`: comma-separated host names or IP literals, lowercased."""
    return frozenset(h.strip().lower().strip("[]") for h in text.split(",") if h.strip())
