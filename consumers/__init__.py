"""The RabbitMQ side: apps and handlers, the delivery loop, retries, the CLI."""

from consumers.app import (
    App,
    BatchHandler,
    HandlerSpec,
    MessageHandler,
    ProviderFactory,
    PushSpec,
    load_app,
)
from consumers.context import Batch, Context
from consumers.decisions import (
    ConfigurationError,
    ConsumersError,
    HandlerDecision,
    Reject,
    Retry,
)
from consumers.envelope import BadInput, Envelope
from consumers.publisher import Publisher, job_message
from consumers.push import DeadToken, InvalidTokenHook
from consumers.push_job import InvalidPushJob, PushJob, parse_push_job, push_job_body
from consumers.retry import RetryPolicy
from consumers.settings import (
    AmqpSettings,
    CrashPoint,
    DatabaseSettings,
    QueueType,
    Settings,
    WorkerSettings,
)
from consumers.worker import Worker
from dedupe import UnknownOutcome

__all__ = [
    "AmqpSettings",
    "App",
    "BadInput",
    "Batch",
    "BatchHandler",
    "ConfigurationError",
    "ConsumersError",
    "Context",
    "CrashPoint",
    "DatabaseSettings",
    "DeadToken",
    "Envelope",
    "HandlerDecision",
    "HandlerSpec",
    "InvalidPushJob",
    "InvalidTokenHook",
    "MessageHandler",
    "ProviderFactory",
    "Publisher",
    "PushJob",
    "PushSpec",
    "QueueType",
    "Reject",
    "Retry",
    "RetryPolicy",
    "Settings",
    "UnknownOutcome",
    "Worker",
    "WorkerSettings",
    "job_message",
    "load_app",
    "parse_push_job",
    "push_job_body",
]
