"""The RabbitMQ side: apps and handlers, the delivery loop, retries, the CLI."""

from consumers.app import App, load_app
from consumers.circuit import CircuitState, CircuitView
from consumers.context import Batch, Context
from consumers.decisions import (
    ConfigurationError,
    ConsumersError,
    HandlerDecision,
    Reject,
    Retry,
)
from consumers.envelope import BadInput, Envelope
from consumers.faults import NO_FAULTS, CrashPoint, Faults, NoFaults
from consumers.publisher import (
    Job,
    NotConfirmed,
    Publisher,
    PublisherError,
    PublisherSettings,
    Unroutable,
    job_message,
)
from consumers.push_job import InvalidPushJob, PushJob, parse_push_job, push_job_body
from consumers.relay import Relay
from consumers.retry import RetryPolicy
from consumers.settings import (
    AmqpSettings,
    DatabaseSettings,
    QueueType,
    RelaySettings,
    RetentionSettings,
    Settings,
    WorkerSettings,
)
from consumers.spec import (
    BatchHandler,
    DeadToken,
    HandlerSpec,
    InvalidTokenHook,
    MessageHandler,
    ProviderFactory,
    PushSpec,
)
from consumers.worker import Worker
from dedupe import UnknownOutcome

__all__ = [
    "NO_FAULTS",
    "AmqpSettings",
    "App",
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
    "DeadToken",
    "Envelope",
    "Faults",
    "HandlerDecision",
    "HandlerSpec",
    "InvalidPushJob",
    "InvalidTokenHook",
    "Job",
    "MessageHandler",
    "NoFaults",
    "NotConfirmed",
    "ProviderFactory",
    "Publisher",
    "PublisherError",
    "PublisherSettings",
    "PushJob",
    "PushSpec",
    "QueueType",
    "Reject",
    "Relay",
    "RelaySettings",
    "RetentionSettings",
    "Retry",
    "RetryPolicy",
    "Settings",
    "UnknownOutcome",
    "Unroutable",
    "Worker",
    "WorkerSettings",
    "job_message",
    "load_app",
    "parse_push_job",
    "push_job_body",
]
