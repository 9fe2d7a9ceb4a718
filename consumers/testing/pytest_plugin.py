"""pytest fixtures to test your own handlers: `worker_for`, `worker_services`, the push fakes.

Opt in from your conftest.py (it needs pytest-asyncio: the `testing` extra):

    pytest_plugins = ["consumers.testing.pytest_plugin"]

It is not a `pytest11` entry point on purpose: one of those loads in every
pytest run of every project installed beside this package, needed or not,
imports the framework (and with it aio-pika, asyncpg, structlog) before any
test, and claims fixture names (`worker_for`) in suites that never asked for
them; Celery's plugin went opt-in for the same reasons. An entry in
`pytest_plugins` says where a fixture comes from.

- `worker_services`: where RabbitMQ and PostgreSQL are (`TEST_AMQP_URL`,
  `TEST_DATABASE_URL`, defaults on 127.0.0.1; see `consumers.testing.services`);
- `worker_for(app, setup_sql=..., settings=...)`: a `TestWorker` on them, to
  use as `async with worker_for(app) as worker:`;
- `fake_apns`, `fake_fcm` (`providers.fakes.pytest_plugin`): a fake APNs and a
  fake FCM for the test, when the `push` extra (h2, cryptography) is installed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import pytest

from consumers.handlers.app import App
from consumers.settings import Settings
from consumers.testing.services import Services
from consumers.testing.worker import TestWorker, WorkerFor


def _fakes_installable() -> bool:
    """The push extra (h2, cryptography) and pytest-asyncio, which the fakes' fixtures use."""
    needed = ("h2", "cryptography", "pytest_asyncio")
    return all(importlib.util.find_spec(name) is not None for name in needed)


pytest_plugins = ["providers.fakes.pytest_plugin"] if _fakes_installable() else []


@pytest.fixture
def worker_services() -> Services:
    """The RabbitMQ and PostgreSQL the test's workers use (TEST_AMQP_URL, TEST_DATABASE_URL)."""
    return Services.from_env(os.environ)


@pytest.fixture
def worker_for(worker_services: Services) -> WorkerFor:
    """Make a `TestWorker` for an app: `async with worker_for(app) as worker:`."""

    def make(
        app: App, *, setup_sql: str | Sequence[str] = (), settings: Settings | None = None
    ) -> TestWorker:
        return TestWorker(app, services=worker_services, setup_sql=setup_sql, settings=settings)

    return make
