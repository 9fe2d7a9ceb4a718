"""Webhook workers SIGKILLed mid-call, then another worker: every intent arrives, and
more than once only for the calls on the wire at the kill, always with one webhook-id.

The receiver holds the calls to one endpoint unanswered until the kill (so the dead
worker's sender had them on the wire, their answers never recorded) and answers the
other endpoint at once. The second worker resends what the ledger does not say was
answered, with the webhook-ids of the first attempts: a receiver that dedupes by
webhook-id sees each intent once.

    .venv/bin/pytest tests/test_webhook_takeover.py -q -s -p no:cacheprovider
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from consumers import Publisher, webhook_job_body
from dedupe import DbConnection
from providers.fakes.webhooks import ReceiverReply, WebhookReceiver
from tests.conftest import AMQP_URL
from tests.support import WorkerProcess, settle, wait_consumers, wait_for
from tests.webhook_support import KEY, add_endpoint

JOBS = 40
IN_FLIGHT = 16  # the sender's connections: what can be on the wire at once
LEASE = 12.0
TIMEOUT = 8.0  # never reached before the kill: no call times out into a resend of its own

pytestmark = pytest.mark.timeout(int(LEASE * 4 + 90))


async def _sent(db: DbConnection) -> set[str]:
    rows = await db.fetch("SELECT effect_id::text FROM send_ledger WHERE status = 'sent'")
    return {"msg_" + r["effect_id"].replace("-", "") for r in rows}


async def test_webhook_workers_sigkilled_mid_call_resend_only_what_was_on_the_wire(
    db: DbConnection,
    schema: str,
    queue_name: str,
    publisher: Publisher,
    worker_env: dict[str, str],
    webhook_receiver: WebhookReceiver,
    tmp_path: Path,
) -> None:
    fast = await add_endpoint(db, schema, webhook_receiver, "/fast")
    held = await add_endpoint(db, schema, webhook_receiver, "/held")
    webhook_receiver.script("/held", ReceiverReply(hold=True))
    env = {
        **worker_env,
        "IW_WEBHOOK_SECRETS_KEY": KEY,
        "TEST_LEASE_SECONDS": str(LEASE),
        "TEST_WEBHOOK_TIMEOUT": str(TIMEOUT),
        "TEST_MAX_IN_FLIGHT": str(IN_FLIGHT),
    }
    first = WorkerProcess("tests.apps.webhook_app:app", env, tmp_path / "first.log")
    second: WorkerProcess | None = None
    try:
        await wait_consumers(AMQP_URL, queue_name, 1)
        for n in range(JOBS):
            body = webhook_job_body(event_type="order.shipped", payload={"order": n})
            await publisher.publish(queue_name, body, message_id=f"order-{n}", tenant="acme")

        async def every_connection_held() -> bool:
            return webhook_receiver.holding >= IN_FLIGHT

        await wait_for(every_connection_held, timeout=TIMEOUT / 2)
        first.kill()
        await first.wait()
        on_wire = webhook_receiver.holding
        webhook_receiver.script("/held", ReceiverReply())  # answered from now on
        webhook_receiver.release()  # the dead worker's calls: nobody reads these answers
        await settle(lambda: _count(webhook_receiver), quiet=1.0)
        arrived = set(webhook_receiver.counts())
        window = arrived - await _sent(db)  # on the wire at the kill, answer not recorded

        second = WorkerProcess("tests.apps.webhook_app:app", env, tmp_path / "second.log")

        async def all_sent() -> bool:
            return len(await _sent(db)) >= JOBS * 2

        await wait_for(all_sent, timeout=LEASE * 3 + 30)
    finally:
        first.stop_now()
        if second is not None:
            second.terminate()
            await second.expect_exit(0)
    counts = webhook_receiver.counts()
    ids_of: dict[tuple[str, int], set[str]] = defaultdict(set)
    for delivery in webhook_receiver.deliveries:
        ids_of[(delivery.path, _order(delivery.body))].add(delivery.webhook_id)
    intents = {(path, n) for path in (fast.path, held.path) for n in range(JOBS)}
    assert set(ids_of) == intents, "an intent never arrived"
    assert all(len(ids) == 1 for ids in ids_of.values()), "an intent arrived under two ids"
    twice = {webhook_id for webhook_id, n in counts.items() if n > 1}
    duplicates = sum(n - 1 for n in counts.values())
    assert twice <= window, f"{len(twice - window)} calls arrived twice outside the crash window"
    assert duplicates <= len(window)
    assert webhook_receiver.rejected == []
    assert second is not None and second.events("webhook_sent")  # its log is read below
    for worker in (first, second):
        log = worker.log_text()
        for endpoint in (fast, held):
            assert endpoint.secret.removeprefix("whsec_") not in log
    print(
        f"webhook takeover: intents={len(intents)} deliveries={len(webhook_receiver.deliveries)}"
        f" held_at_kill={on_wire} in_crash_window={len(window)} arrived_twice={len(twice)}"
        f" duplicates={duplicates}"
    )


def _order(body: bytes) -> int:
    order: int = json.loads(body)["data"]["order"]
    return order


async def _count(receiver: WebhookReceiver) -> int:
    return len(receiver.deliveries)
