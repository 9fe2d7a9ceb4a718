"""What a test's worker gets of its own, so tests at once on one broker and database never meet.

- A queue prefix, `test-<10 hex>.`: the app's `orders.shipped` is consumed
  from `test-<10 hex>.orders.shipped`, its retry tiers and dead-letter queue follow
  the work queue's name (`consumers.handlers.retry`). A queue's name is also
  its consumer's name, so the dedupe keys and `ctx.consumer` carry the
  prefixed name; they live in the test's schema, which no other test reads.
- A schema, `test_<16 hex>`: the framework's tables (migrated there) and the
  app's own (`setup_sql`), first on the worker's search_path.
- Settings on the test's services and schema, with no relay: a handler's
  `ctx.emit()` names the app's queues, not the prefixed ones, so its rows
  stay in the outbox for the test to read.

No vhost is needed (creating one takes the management API or rabbitmqctl).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace

from consumers.handlers.app import App
from consumers.settings import Settings, WorkerSettings
from consumers.testing.services import Services

# A test's worker stops within this; what it still holds goes back to its queue.
TEST_SHUTDOWN_GRACE_S = 10.0
TEST_SETTINGS = Settings(worker=WorkerSettings(shutdown_grace_seconds=TEST_SHUTDOWN_GRACE_S))


@dataclass(frozen=True, slots=True, kw_only=True)
class Isolation:
    prefix: str  # before each of the app's queue names on the broker
    schema: str

    @classmethod
    def fresh(cls) -> Isolation:
        return cls(prefix=f"test-{secrets.token_hex(5)}.", schema=f"test_{secrets.token_hex(8)}")

    def queues(self, app: App) -> dict[str, str]:
        """The app's name of each queue -> its name on the broker."""
        return {queue: self.prefix + queue for queue in app.specs}

    def app(self, app: App) -> App:
        """A copy of `app` whose handlers consume the prefixed queues."""
        copy = App(retry=app.retry, faults=app.faults)
        for queue, spec in app.specs.items():
            copy._add(replace(spec, queue=self.prefix + queue))  # what registering ends in
        return copy

    def settings(self, settings: Settings | None, services: Services) -> Settings:
        """`settings` (or the tests' defaults) on `services` and the schema, with no relay."""
        base = settings or TEST_SETTINGS
        return replace(
            base,
            amqp=replace(base.amqp, urls=(services.amqp_url,)),
            database=replace(base.database, url=services.database_url, schema=self.schema),
            relay=replace(base.relay, in_run=False),
        )


def names_on_broker(isolation: Isolation, app: App) -> Mapping[str, str]:
    """The broker's name of each queue -> the app's: how outcome lines are read back."""
    return {ours: theirs for theirs, ours in isolation.queues(app).items()}
