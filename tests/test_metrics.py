"""/metrics, /healthz and /readyz of a real worker process, against the real services."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from urllib.parse import urlsplit, urlunsplit

import aio_pika

from consumers import App, Publisher, Settings, Worker, push_job_body
from dedupe import DbConnection, Outbox
from providers import FcmProvider, Platform, Provider, Target
from providers.fakes.fcm import FakeFcm, FcmReply
from proving.chaos.proxy import FaultProxy
from proving.chaos.services import free_port
from tests.apps.push_app import FAST_RETRY
from tests.conftest import AMQP_URL, DATABASE_URL, Spawn
from tests.support import WorkerProcess, http_get, scrape, settle, wait_declared, wait_for

M = "idempotent_workers_"


def _messages(samples: dict[str, float], queue: str, outcome: str, reason: str = "") -> float:
    key = f'{M}messages_total{{consumer="{queue}",outcome="{outcome}",reason="{reason}"}}'
    return samples.get(key, 0.0)


async def test_scrape_after_a_known_workload_shows_the_exact_counts(
    db: DbConnection, schema: str, queue_name: str, publisher: Publisher, spawn: Spawn
) -> None:
    worker = spawn({"IW_METRICS_PORT": "0"})
    base = await worker.endpoint()
    await wait_declared(AMQP_URL, queue_name)
    await wait_for(lambda: _answers(base, "/readyz", 200), timeout=60)
    for n in range(20):  # 20 effects
        await publisher.publish(queue_name, {"n": n}, message_id=f"job-{n}")
    for n in range(7):  # 7 exact copies: duplicates absorbed
        await publisher.publish(queue_name, {"n": n}, message_id=f"job-{n}")
    for n in range(3):  # 3 ids reused for another body
        await publisher.publish(queue_name, {"n": 100 + n}, message_id=f"job-{n}")
    for n in range(2):  # 2 the handler rejects
        await publisher.publish(queue_name, {"reject": "not_today"}, message_id=f"no-{n}")
    connection = await aio_pika.connect(AMQP_URL)
    try:  # 1 that is not JSON
        channel = await connection.channel()
        await channel.default_exchange.publish(
            aio_pika.Message(b"{not json", message_id="broken-1"), routing_key=queue_name
        )
    finally:
        await connection.close()
    total = 20 + 7 + 3 + 2 + 1

    async def all_settled() -> bool:
        samples = await scrape(base)
        settled = sum(v for k, v in samples.items() if k.startswith(f"{M}messages_total{{"))
        return settled >= total

    await wait_for(all_settled, timeout=60)
    await db.execute("ANALYZE processed_messages")  # reltuples exact on a small table
    async with db.transaction():  # 3 follow-ups waiting for a relay (none runs here)
        for n in range(3):
            await Outbox(schema).enqueue(db, queue="follow.up", body={"n": n}, message_id=f"f-{n}")
    await asyncio.sleep(0.1)
    samples = await scrape(base)

    assert _messages(samples, queue_name, "effect_committed") == 20
    assert _messages(samples, queue_name, "duplicate_ignored") == 7
    assert _messages(samples, queue_name, "message_id_reused") == 3
    assert _messages(samples, queue_name, "dead_lettered", "not_today") == 2
    assert _messages(samples, queue_name, "dead_lettered", "invalid_json") == 1
    settled = sum(v for k, v in samples.items() if k.startswith(f"{M}messages_total{{"))
    assert settled == total
    label = f'{{consumer="{queue_name}"}}'
    assert samples[f"{M}batch_messages_sum{label}"] == total
    assert samples[f"{M}batch_commit_seconds_count{label}"] >= 1
    assert samples[f"{M}handler_seconds_count{label}"] >= 1
    assert samples[f"{M}deliveries_in_flight{label}"] == 0
    assert samples.get(f"{M}acks_failed_total{label}", 0) == 0
    assert samples.get(f"{M}database_stalls_total{label}", 0) == 0
    assert samples[f"{M}dedupe_rows"] == 20  # the rejected ones' claims were released
    assert 0 <= samples[f"{M}dedupe_oldest_claim_age_seconds"] < 120
    assert samples[f"{M}outbox_pending"] == 3 and samples[f"{M}relay_lag_seconds"] > 0
    assert samples[f"{M}ready"] == 1

    worker.terminate()
    await worker.expect_exit(0)
    assert await db.fetchval("SELECT count(*) FROM effects") == 20


async def test_readyz_turns_not_ready_while_postgresql_is_unreachable_and_ready_after(
    db: DbConnection, queue_name: str, publisher: Publisher, spawn: Spawn
) -> None:
    upstream = urlsplit(DATABASE_URL)
    proxy = FaultProxy("postgresql", free_port(), upstream.port or 5432)
    await proxy.start()
    auth = upstream.netloc.rsplit("@", 1)[0] + "@" if "@" in upstream.netloc else ""
    through = urlunsplit(upstream._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))
    try:
        worker = spawn({"IW_METRICS_PORT": "0", "DATABASE_URL": through})
        base = await worker.endpoint()

        def answers(path: str, code: int) -> Awaitable[bool]:
            return _answers(base, path, code)

        await wait_for(lambda: answers("/readyz", 200), timeout=60)
        await publisher.publish(queue_name, {"n": 1}, message_id="before-cut")
        await wait_for(lambda: _effects(db, 1), timeout=30)

        await proxy.close()  # PostgreSQL unreachable: connections reset, new ones refused
        await wait_for(lambda: answers("/readyz", 503), timeout=30)
        status, body = await http_get(base + "/readyz")
        assert status == 503 and "postgresql" in body, body
        assert await answers("/healthz", 200)  # liveness never depends on the services
        await publisher.publish(queue_name, {"n": 2}, message_id="during-cut")
        # The worker holds that delivery and re-runs its batch while the database is away.
        await wait_for(lambda: _reruns(worker, 2), timeout=30)

        await proxy.start()  # reachable again
        await wait_for(lambda: answers("/readyz", 200), timeout=60)
        await wait_for(lambda: _effects(db, 2), timeout=60)
        samples = await scrape(base)
        assert samples[f"{M}ready"] == 1
        worker.terminate()
        await worker.expect_exit(0)
        await settle(lambda: _count(db), quiet=0.5)
        assert await _count(db) == 2
    finally:
        await proxy.close()


async def _answers(base: str, path: str, code: int) -> bool:
    status, _ = await http_get(base + path)
    return status == code


async def _reruns(worker: WorkerProcess, at_least: int) -> bool:
    return len(worker.events("batch_rerun")) >= at_least


async def _count(db: DbConnection) -> int:
    value: int = await db.fetchval("SELECT count(*) FROM effects")
    return value


async def _effects(db: DbConnection, n: int) -> bool:
    return await _count(db) >= n


async def test_an_open_provider_circuit_makes_the_worker_not_ready_and_shows_in_metrics(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    fake_fcm: FakeFcm,
) -> None:
    fake_fcm.unscripted = FcmReply(status=403, error_code="PERMISSION_DENIED")
    app = App(retry=FAST_RETRY)

    async def provider() -> Provider:
        return FcmProvider(fake_fcm.settings(timeout_seconds=5.0))

    app.push_handler(queue_name, provider=provider, probe_seconds=0.5)
    async with Worker(app, settings) as worker:
        assert (await worker.readiness()).ok
        device = Target(platform=Platform.ANDROID, token="device-0001-xxxx")
        await publisher.publish(
            queue_name, push_job_body(targets=[device], body="x"), message_id="j-1"
        )

        async def paused() -> bool:
            return not (await worker.readiness()).ok

        await wait_for(paused, timeout=60)
        status = await worker.readiness()
        assert "provider fcm paused" in status.detail and "PERMISSION_DENIED" in status.detail
        key = f'{M}provider_circuit_open{{consumer="{queue_name}",provider="fcm"}}'
        assert _samples(worker)[key] == 1

        fake_fcm.unscripted = FcmReply()  # the credentials are fixed: a probe resumes

        async def resumed() -> bool:
            return (await worker.readiness()).ok

        await wait_for(resumed, timeout=60)
        assert _samples(worker)[key] == 0


def _samples(worker: Worker) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in worker.metrics.registry.collect():
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found
