"""Where the services a test runs against are: a RabbitMQ and a PostgreSQL, real ones.

Read from `TEST_AMQP_URL` and `TEST_DATABASE_URL` (not `AMQP_URL` and
`DATABASE_URL`: a test run must never reach production because a shell
exported its variables), defaulting to RabbitMQ and PostgreSQL on 127.0.0.1,
as `docker compose up -d` starts them. The kit makes its queues and its schema
there and removes them afterwards; it needs no other database or vhost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass(frozen=True, slots=True, kw_only=True)
class Services:
    amqp_url: str = DEFAULT_AMQP_URL
    database_url: str = DEFAULT_DATABASE_URL

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Services:
        """`TEST_AMQP_URL` and `TEST_DATABASE_URL`, each defaulting to 127.0.0.1."""
        return cls(
            amqp_url=env.get("TEST_AMQP_URL") or DEFAULT_AMQP_URL,
            database_url=env.get("TEST_DATABASE_URL") or DEFAULT_DATABASE_URL,
        )
