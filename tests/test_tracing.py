"""One trace from the HTTP request to the provider's answer, with the real OpenTelemetry SDK
and its OTLP/HTTP exporter sending to a local receiver (`tests.otlp`), decoded with
opentelemetry-proto; publishers that are not ours (pika) continue it; without the
OTEL_* variables nothing is exported anywhere, the default OTLP port included.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pika
import pytest

from consumers import App, Relay, Settings, TracingSettings
from consumers.telemetry.tracing import tracing
from consumers.telemetry.tracing_setup import configure_tracing
from ingress.settings import IngressSettings
from providers.fakes.apns import FakeApns
from providers.fakes.fcm import FakeFcm
from proving.otlp import ExportedSpan, OtlpReceiver, start_receiver
from tests.apps.effects import FAST_RETRY, record
from tests.conftest import AMQP_URL, DATABASE_URL
from tests.harness import Harness
from tests.ingress_support import Served, serve_in_process
from tests.support import ROOT, WorkerProcess, wait_consumers, wait_for
from tests.test_push import push_app

OTEL_VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_SDK_DISABLED",
)


def new_traceparent() -> tuple[str, str, str]:
    """A W3C traceparent a client made: (header, trace_id, span_id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    found = start_receiver()
    yield found
    found.server.shutdown()
    found.server.server_close()


@pytest.fixture
def traced(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """Tracing on in this process, exported to `receiver` every 50 ms; off again after."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "tests-in-process")
    configure_tracing(TracingSettings.from_env(os.environ))
    try:
        yield receiver
    finally:
        tracing().shutdown()
        configure_tracing(TracingSettings())


async def spans_of(receiver: OtlpReceiver, trace_id: str, *names: str) -> list[ExportedSpan]:
    """The trace's spans once one of each name has arrived (the exporter sends in batches)."""

    async def arrived() -> bool:
        have = {s.name for s in receiver.traced(trace_id)}
        return all(name in have for name in names)

    await wait_for(arrived, timeout=30)
    return receiver.traced(trace_id)


def one(spans: list[ExportedSpan], name: str) -> ExportedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [(s.name, s.span_id) for s in spans])
    return found[0]


@pytest.fixture
async def served(
    traced: OtlpReceiver, harness: Harness, settings: Settings
) -> AsyncIterator[Served]:
    async with serve_in_process(
        harness.db, settings.database, IngressSettings(queue=harness.queue)
    ) as s:
        yield s


async def test_a_curl_post_with_a_traceparent_is_one_trace_down_to_the_provider_send(
    traced: OtlpReceiver,
    served: Served,
    harness: Harness,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    header, trace_id, client_span = new_traceparent()
    body = json.dumps(
        {
            "targets": [{"platform": "ios", "token": "ios-token-aaaaaaaaaaaa"}],
            "idempotency_key": "t1",
        }
    )
    posted = await asyncio.to_thread(
        subprocess.run,
        [
            "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
            "-H", f"Authorization: Bearer {served.key}",
            "-H", "Content-Type: application/json",
            "-H", f"traceparent: {header}",
            "--data-binary", body,
            f"{served.url}/v1/messages",
        ],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert posted.stdout == "202"
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        relay = Relay(harness.settings)  # once the worker declared the queue: one publish
        await relay.start()
        try:
            spans = await spans_of(
                traced,
                trace_id,
                "POST /v1/messages",
                f"create {harness.queue}",
                f"publish {harness.queue}",
                f"process {harness.queue}",
                "send apns",
            )
        finally:
            await relay.stop()
    server = one(spans, "POST /v1/messages")
    create = one(spans, f"create {harness.queue}")
    publish = one(spans, f"publish {harness.queue}")
    process = one(spans, f"process {harness.queue}")
    send = one(spans, "send apns")
    assert (server.kind, server.parent_span_id) == ("server", client_span)
    assert server.attributes["http.response.status_code"] == 202
    assert (create.kind, create.parent_span_id) == ("producer", server.span_id)
    assert (publish.kind, publish.parent_span_id) == ("producer", create.span_id)
    assert (process.kind, process.parent_span_id) == ("consumer", publish.span_id)
    assert process.attributes["messaging.system"] == "rabbitmq"
    assert process.attributes["messaging.destination.name"] == harness.queue
    assert process.attributes["idempotent_workers.outcome"] == "effect_committed"
    assert (send.kind, send.parent_span_id) == ("client", process.span_id)
    ledger = await harness.db.fetchval("SELECT provider_message_id FROM send_ledger")
    assert send.attributes["idempotent_workers.provider_message_id"] == ledger
    assert ledger == fake_apns.requests[0].apns_id
    ((batch_trace, batch_span),) = process.links  # the job's batch, holding the claim

    async def claimed() -> bool:
        return any(
            s.name == "claim" and s.parent_span_id == batch_span for s in traced.traced(batch_trace)
        )

    await wait_for(claimed, timeout=30)


def pika_publish(queue: str, body: bytes, message_id: str, headers: dict[str, str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            exchange="",
            routing_key=queue,
            body=body,
            properties=pika.BasicProperties(
                message_id=message_id,
                content_type="application/json",
                delivery_mode=2,
                headers=headers,
            ),
            mandatory=True,
        )
    finally:
        connection.close()


async def test_a_pika_publish_with_a_traceparent_is_processed_in_its_trace(
    traced: OtlpReceiver, harness: Harness
) -> None:
    header, trace_id, pika_span = new_traceparent()
    state = "vendor=opaque"
    async with harness.run(app_for(harness.queue)):
        await asyncio.to_thread(
            pika_publish,
            harness.queue,
            b'{"n": 1}',
            "pika-1",
            {"traceparent": header, "tracestate": state},
        )
        spans = await spans_of(traced, trace_id, f"process {harness.queue}")
    process = one(spans, f"process {harness.queue}")
    assert process.parent_span_id == pika_span
    assert process.attributes["messaging.message.id"] == "pika-1"
    assert process.attributes["idempotent_workers.outcome"] == "effect_committed"
    # The claim and the commit hang under the batch's span, which the message links to.
    ((batch_trace, batch_span),) = process.links

    async def batch_steps() -> bool:
        names = {s.name for s in traced.traced(batch_trace) if s.parent_span_id == batch_span}
        return {"claim", "commit"} <= names

    await wait_for(batch_steps, timeout=30)
    claim = next(s for s in traced.traced(batch_trace) if s.name == "claim")
    assert claim.attributes["db.system.name"] == "postgresql"
    batch = next(s for s in traced.traced(batch_trace) if s.span_id == batch_span)
    assert batch.attributes["messaging.batch.message_count"] == 1


def app_for(queue: str) -> App:
    """The effects app on `queue` (its handler inserts one row per message)."""
    app = App(retry=FAST_RETRY)
    app.handler(queue)(record)
    return app


async def test_a_dead_lettered_job_keeps_its_publishers_traceparent_as_it_came(
    traced: OtlpReceiver, harness: Harness
) -> None:
    header, trace_id, _ = new_traceparent()
    state = "congo=t61rcWkgMzE"
    async with harness.run(app_for(harness.queue)):
        await asyncio.to_thread(
            pika_publish,
            harness.queue,
            b"{not json",
            "bad-1",
            {"traceparent": header, "tracestate": state},
        )
        await harness.wait_dead_letters(1)
        spans = await spans_of(traced, trace_id, f"process {harness.queue}")
    (letter,) = await harness.dead_letters()
    assert letter.headers["traceparent"] == header and letter.headers["tracestate"] == state
    process = one(spans, f"process {harness.queue}")
    assert process.attributes["idempotent_workers.outcome"] == "dead_lettered"
    assert process.attributes["idempotent_workers.reason"] == "invalid_json"
    assert process.error


async def test_a_retry_through_a_delay_tier_stays_in_the_publishers_trace(
    traced: OtlpReceiver, harness: Harness, tmp_path: Path
) -> None:
    header, trace_id, pika_span = new_traceparent()
    gate = tmp_path / "held"
    gate.write_text("x")
    async with harness.run(app_for(harness.queue)):
        await asyncio.to_thread(
            pika_publish,
            harness.queue,
            json.dumps({"n": 2, "reject_while": str(gate)}).encode(),
            "retried-1",
            {"traceparent": header},
        )
        await harness.wait_dead_letters(1)
    spans = await spans_of(traced, trace_id, f"process {harness.queue}")
    processed = [s for s in spans if s.name == f"process {harness.queue}"]
    assert processed and all(s.parent_span_id == pika_span for s in processed)


async def test_a_replay_links_to_the_dead_letters_trace(
    traced: OtlpReceiver, harness: Harness
) -> None:
    header, trace_id, pika_span = new_traceparent()
    async with harness.run(app_for(harness.queue)):
        await asyncio.to_thread(
            pika_publish,
            harness.queue,
            json.dumps({"n": 3, "reject": "no"}).encode(),
            "replayed-1",
            {"traceparent": header},
        )
        await harness.wait_dead_letters(1)
    env = {
        **{k: v for k, v in os.environ.items() if k not in OTEL_VARIABLES},
        "AMQP_URL": AMQP_URL,
        "DATABASE_URL": DATABASE_URL,
        "DATABASE_SCHEMA": harness.settings.database.schema,
        "OTEL_EXPORTER_OTLP_ENDPOINT": traced.endpoint,
        "OTEL_SERVICE_NAME": "replayer",
        "PYTHONPATH": str(ROOT),
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "consumers", "dlq", "replay", harness.queue],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    async def replayed() -> bool:
        return any(s.service == "replayer" for s in traced.named(f"replay {harness.queue}"))

    await wait_for(replayed, timeout=30)
    replay = next(s for s in traced.named(f"replay {harness.queue}") if s.service == "replayer")
    assert (trace_id, pika_span) in replay.links
    assert replay.trace_id != trace_id


async def test_processes_name_themselves_flush_on_sigterm_and_join_their_log_lines(
    receiver: OtlpReceiver, harness: Harness, tmp_path: Path
) -> None:
    header, trace_id, pika_span = new_traceparent()
    worker = WorkerProcess(
        "tests.apps.effects:app",
        {k: v for k, v in os.environ.items() if k not in OTEL_VARIABLES},
        tmp_path / "worker.log",
        extra_env={
            "TEST_QUEUE": harness.queue,
            "AMQP_URL": AMQP_URL,
            "DATABASE_URL": DATABASE_URL,
            "DATABASE_SCHEMA": harness.settings.database.schema,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "worker-under-test",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
            "OTEL_BSP_SCHEDULE_DELAY": "600000",  # ten minutes: only the stop flushes them
        },
    )
    await wait_consumers(AMQP_URL, harness.queue, 1, timeout=60)
    await asyncio.to_thread(
        pika_publish, harness.queue, b'{"n": 10}', "flushed-1", {"traceparent": header}
    )

    async def processed() -> bool:
        return await harness.effects() >= 1

    await wait_for(processed, timeout=60)
    assert receiver.traced(trace_id) == []  # held by the batch span processor until the stop
    worker.terminate()
    assert await worker.wait(60) == 0
    spans = await spans_of(receiver, trace_id, f"process {harness.queue}")
    process = one(spans, f"process {harness.queue}")
    assert process.service == "worker-under-test" and process.parent_span_id == pika_span
    lines = [json.loads(line) for line in (tmp_path / "worker.log").read_text().splitlines()]
    committed = next(
        line for line in lines if line.get("event") == "effect_committed"
        and line.get("message_id") == "flushed-1"
    )  # fmt: skip
    assert (committed["trace_id"], committed["span_id"]) == (trace_id, process.span_id)


async def test_without_otel_variables_nothing_is_exported_not_even_to_the_default_port(
    harness: Harness, tmp_path: Path
) -> None:
    try:
        default = start_receiver(port=4318)
    except OSError as exc:
        pytest.fail(f"the default OTLP port 4318 is taken on this machine, cannot watch it: {exc}")
    try:
        worker = WorkerProcess(
            "tests.apps.effects:app",
            {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            tmp_path / "worker.log",
            extra_env={
                "TEST_QUEUE": harness.queue,
                "AMQP_URL": AMQP_URL,
                "DATABASE_URL": DATABASE_URL,
                "DATABASE_SCHEMA": harness.settings.database.schema,
            },
        )
        header, _, _ = new_traceparent()
        await wait_consumers(AMQP_URL, harness.queue, 1, timeout=60)
        await harness.publish({"n": 1}, message_id="quiet-1")
        await asyncio.to_thread(
            pika_publish, harness.queue, b'{"n": 2}', "quiet-2", {"traceparent": header}
        )

        async def both() -> bool:
            return await harness.effects() >= 2

        await wait_for(both, timeout=60)
        worker.terminate()
        assert await worker.wait(60) == 0
        assert default.requests == 0 and default.spans == []
        assert "trace_id" not in (tmp_path / "worker.log").read_text()
    finally:
        default.server.shutdown()
        default.server.server_close()


async def test_a_traced_message_published_by_aio_pika_without_a_traceparent_starts_a_trace(
    traced: OtlpReceiver, harness: Harness, channel: aio_pika.abc.AbstractChannel
) -> None:
    async with harness.run(app_for(harness.queue)):
        await harness.publish({"n": 4}, message_id="ours-1")
        await harness.wait_processed(1)

        async def seen() -> bool:
            return any(
                s.attributes.get("messaging.message.id") == "ours-1"
                for s in traced.named(f"process {harness.queue}")
            )

        await wait_for(seen, timeout=30)
    process = next(
        s for s in traced.named(f"process {harness.queue}")
        if s.attributes.get("messaging.message.id") == "ours-1"
    )  # fmt: skip
    publish = next(
        s for s in traced.named(f"publish {harness.queue}") if s.trace_id == process.trace_id
    )
    assert process.parent_span_id == publish.span_id  # our Publisher carried its context
