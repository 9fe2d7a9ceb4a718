"""Test your own handlers: your App on the real RabbitMQ and PostgreSQL, then nothing left.

    # conftest.py
    pytest_plugins = ["consumers.testing.pytest_plugin"]

    # test_shipments.py
    async def test_a_shipment_is_recorded_once(worker_for: WorkerFor) -> None:
        async with worker_for(app, setup_sql=SCHEMA) as worker:
            await worker.publish("orders.shipped", {"order_id": 1042}, message_id="o-1042")
            await worker.committed("o-1042")

`TestWorker` (`consumers.testing.worker`) runs the app in the test's process
on queues and a schema of its own and removes them afterwards; its waits read
the worker's own outcome lines (`consumers.testing.outcomes`). The plugin
gives `worker_for` and `worker_services`, and the push fakes `fake_apns` and
`fake_fcm` when the `push` extra is installed. Guide: docs/testing.md.
"""

from consumers.testing.outcomes import Awaited, OutcomeLine, OutcomeNotSeen
from consumers.testing.services import Services
from consumers.testing.worker import Emitted, TestWorker, WorkerFor

__all__ = [
    "Awaited",
    "Emitted",
    "OutcomeLine",
    "OutcomeNotSeen",
    "Services",
    "TestWorker",
    "WorkerFor",
]
