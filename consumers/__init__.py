"""The RabbitMQ side: apps and handlers, the delivery loop, retries, the CLI."""

from consumers.app import App, BatchHandler, HandlerSpec, MessageHandler, load_app
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
    "Envelope",
    "HandlerDecision",
    "HandlerSpec",
    "MessageHandler",
    "Publisher",
    "QueueType",
    "Reject",
    "Retry",
    "RetryPolicy",
    "Settings",
    "Worker",
    "WorkerSettings",
    "job_message",
    "load_app",
]
