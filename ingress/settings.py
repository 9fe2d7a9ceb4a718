"""How `idempotent-workers serve` runs: where it listens, where jobs go, how commits group.

Each kind of job has its queue: push jobs `queue` (IW_INGRESS_QUEUE), webhook jobs
`webhook_queue` (IW_INGRESS_WEBHOOK_QUEUE), e-mail jobs `email_queue`
(IW_INGRESS_EMAIL_QUEUE). A kind without a queue is not served: its route answers
501 `kind_not_served`, naming the flag and the variable that would serve it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from consumers.jobs.push import MAX_JOB_BYTES

DEFAULT_PUSH_QUEUE = "notifications.push"
# 100,000 devices of 160-character tokens (FCM's) in JSON are about 20 MiB.
MAX_REQUEST_BYTES = 64 * 1_048_576


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    queue: str = DEFAULT_PUSH_QUEUE  # the push queue accepted jobs are relayed to
    webhook_queue: str | None = None  # where webhook jobs go; None: POST /v1/webhooks is 501
    email_queue: str | None = None  # where e-mail jobs go; None: POST /v1/emails is 501
    # Web Push endpoint hosts a subscription may name although private or loopback:
    # serve takes the workers' (`WorkerSettings.webpush_allow_hosts`, IW_WEBPUSH_ALLOW_HOSTS),
    # so the door and the worker refuse the same subscriptions (tests and demos only).
    webpush_allow_hosts: frozenset[str] = frozenset()
    max_batch: int = 256  # requests in one commit at most
    lanes: int = 2  # commits in flight at once (each a pooled connection)
    key_cache_seconds: float = 30.0  # how long a known API key skips the database
    bad_key_seconds: float = 5.0  # how long a key not found is refused without asking again
    # A larger job is 413: the push worker's limit (IW_MAX_BODY_BYTES), each part's
    max_body_bytes: int = MAX_JOB_BYTES
    # A larger request is 413 before it is read: room for a send to MAX_AUDIENCE devices
    max_request_bytes: int = MAX_REQUEST_BYTES
    max_header_bytes: int = 32_768  # a longer head (request line and headers) is 431
    # The deadlines of `consumers.runtime.http_limits`, 408 past them: a head not
    # whole this long after the connection (or the last answer on it); a body not
    # whole this long after its head, plus a second for every `body_min_rate` bytes
    # of it that came.
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    body_min_rate: float = 500.0  # bytes a second

    def __post_init__(self) -> None:
        for name in ("header_timeout_seconds", "body_timeout_seconds", "body_min_rate"):
            if not getattr(self, name) > 0:  # NaN too
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> IngressSettings:
        """Read IW_INGRESS_* variables (the CLI's flags win over them)."""
        return cls(
            host=env.get("IW_INGRESS_HOST", "127.0.0.1"),
            port=int(env.get("IW_INGRESS_PORT", "8080")),
            queue=env.get("IW_INGRESS_QUEUE", DEFAULT_PUSH_QUEUE),
            webhook_queue=env.get("IW_INGRESS_WEBHOOK_QUEUE") or None,
            email_queue=env.get("IW_INGRESS_EMAIL_QUEUE") or None,
            max_batch=int(env.get("IW_INGRESS_MAX_BATCH", "256")),
            lanes=int(env.get("IW_INGRESS_LANES", "2")),
            max_body_bytes=int(env.get("IW_MAX_BODY_BYTES", str(MAX_JOB_BYTES))),
            max_request_bytes=int(env.get("IW_INGRESS_MAX_REQUEST_BYTES", str(MAX_REQUEST_BYTES))),
            key_cache_seconds=float(env.get("IW_INGRESS_KEY_CACHE_SECONDS", "30")),
            bad_key_seconds=float(env.get("IW_INGRESS_BAD_KEY_SECONDS", "5")),
            max_header_bytes=int(env.get("IW_INGRESS_MAX_HEADER_BYTES", "32768")),
            header_timeout_seconds=float(env.get("IW_INGRESS_HEADER_TIMEOUT", "10")),
            body_timeout_seconds=float(env.get("IW_INGRESS_BODY_TIMEOUT", "30")),
            body_min_rate=float(env.get("IW_INGRESS_BODY_MIN_RATE", "500")),
        )
