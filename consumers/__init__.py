"""The RabbitMQ side of idempotent-workers: its public face.

Everything a user, a test or a tool of ours needs is imported here and listed
in `__all__`; the subpackages (message, handlers, pipeline, push, publishing,
broker, retention, telemetry, runtime, commands, jobs, effects) are the inside,
free to change. `consumers.testing`, the kit for testing your own handlers, is
a public face of its own, as structlog's `testing` is.
"""

from consumers.effects.circuit import CircuitState, CircuitView
from consumers.fleet import ProviderQuota, QuotaSettings, TenantSettings
from consumers.handlers.app import App
from consumers.handlers.context import Batch, Context
from consumers.handlers.faults import NO_FAULTS, CrashPoint, Faults, NoFaults
from consumers.handlers.loading import AppNotLoaded, AppProblem, load_app
from consumers.handlers.retry import RetryPolicy, bulk_lane, dead_letter_queue, tier_queue
from consumers.handlers.spec import (
    BatchHandler,
    EffectSpec,
    HandlerSpec,
    InvalidTokenHook,
    MessageHandler,
    ProviderFactory,
)
from consumers.jobs.api import ApiJob, ApiKind, api_job_body, parse_api_job
from consumers.jobs.email import (
    EMAIL,
    EmailJob,
    EmailKind,
    InvalidEmailJob,
    email_job_body,
    parse_email_job,
)
from consumers.jobs.kind import DeadTarget, EffectKind, InvalidJob, Recipient
from consumers.jobs.push import PUSH, InvalidPushJob, PushJob, parse_push_job, push_job_body
from consumers.jobs.webhook import (
    InvalidWebhookJob,
    WebhookJob,
    WebhookKind,
    parse_webhook_job,
    webhook_job_body,
)
from consumers.message.decisions import (
    ConfigurationError,
    ConsumersError,
    HandlerDecision,
    Reject,
    Retry,
)
from consumers.message.envelope import (
    ATTEMPT_HEADER,
    REASON_HEADER,
    TENANT_HEADER,
    BadInput,
    Envelope,
)
from consumers.publishing.parts import JobPart, publish_push_job, push_job_parts
from consumers.publishing.publisher import (
    Job,
    NotConfirmed,
    Publisher,
    PublisherError,
    PublisherSettings,
    Unroutable,
    job_message,
)
from consumers.publishing.relay import Relay
from consumers.runtime.worker import Worker
from consumers.settings import (
    AmqpSettings,
    DatabaseSettings,
    QueueType,
    RelaySettings,
    RetentionSettings,
    Settings,
    TracingSettings,
    WebhookSettings,
    WorkerSettings,
)
from consumers.telemetry.logs import configure_logging
from consumers.telemetry.tracing import SpanKind, Tracing, tracing
from dedupe import UnknownOutcome

__all__ = [
    "ATTEMPT_HEADER",
    "EMAIL",
    "NO_FAULTS",
    "PUSH",
    "REASON_HEADER",
    "TENANT_HEADER",
    "AmqpSettings",
    "ApiJob",
    "ApiKind",
    "App",
    "AppNotLoaded",
    "AppProblem",
    "BadInput",
    "Batch",
    "BatchHandler",
    "CircuitState",
    "CircuitView",
    "ConfigurationError",
    "ConsumersError",
    "Context",
    "CrashPoint",
    "DatabaseSettings",
    "DeadTarget",
    "EffectKind",
    "EffectSpec",
    "EmailJob",
    "EmailKind",
    "Envelope",
    "Faults",
    "HandlerDecision",
    "HandlerSpec",
    "InvalidEmailJob",
    "InvalidJob",
    "InvalidPushJob",
    "InvalidTokenHook",
    "InvalidWebhookJob",
    "Job",
    "JobPart",
    "MessageHandler",
    "NoFaults",
    "NotConfirmed",
    "ProviderFactory",
    "ProviderQuota",
    "Publisher",
    "PublisherError",
    "PublisherSettings",
    "PushJob",
    "QueueType",
    "QuotaSettings",
    "Recipient",
    "Reject",
    "Relay",
    "RelaySettings",
    "RetentionSettings",
    "Retry",
    "RetryPolicy",
    "Settings",
    "SpanKind",
    "TenantSettings",
    "Tracing",
    "TracingSettings",
    "UnknownOutcome",
    "Unroutable",
    "WebhookJob",
    "WebhookKind",
    "WebhookSettings",
    "Worker",
    "WorkerSettings",
    "api_job_body",
    "bulk_lane",
    "configure_logging",
    "dead_letter_queue",
    "email_job_body",
    "job_message",
    "load_app",
    "parse_api_job",
    "parse_email_job",
    "parse_push_job",
    "parse_webhook_job",
    "publish_push_job",
    "push_job_body",
    "push_job_parts",
    "tier_queue",
    "tracing",
    "webhook_job_body",
]
