"""The demo run: two worker processes, a SIGKILL mid-run, duplicates and bad input.

Everything the report says is read back from PostgreSQL (the effect table)
and RabbitMQ (the dead-letter queue), never from the workers' own counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from consumers import REASON_HEADER, Publisher, Settings, dead_letter_queue
from consumers.broker.topology import declare, delete
from dedupe import LEASE_EXPIRED, migrate
from proving.deadlines import ANSWER_S, within
from proving.demo.app import PUSH_QUEUE, QUEUE, app, follows_up
from proving.demo.ingress import (
    IngressTally,
    Serve,
    create_key,
    ingress_report,
    send_all,
    split_jobs,
)
from proving.demo.pushes import DemoFakes, plan_pushes, push_report, settled_targets

DEMO_DATABASE = "idempotent_workers_demo"
TENANTS = ("acme", "globex", "initech")


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    message_id: str | None
    body: bytes
    tenant: str
    kind: str  # original | duplicate | reused | malformed


def plan_jobs(total: int, rng: random.Random) -> list[Job]:
    """`total` publishes: 10% exact duplicates, 1% reused ids, 1% malformed."""
    duplicates = total // 10
    reused = total // 100
    malformed = total // 100
    originals = total - duplicates - reused - malformed
    jobs = []
    for n in range(originals):
        body = {"order_id": n, "carrier": rng.choice(["ups", "dhl", "fedex"]), "items": n % 7 + 1}
        jobs.append(
            Job(
                message_id=f"order-{n}-shipped",
                body=_json(body),
                tenant=TENANTS[n % len(TENANTS)],
                kind="original",
            )
        )
    for _ in range(duplicates):
        jobs.append(replace(rng.choice(jobs[:originals]), kind="duplicate"))
    for source in rng.sample(jobs[:originals], reused):
        body = json.loads(source.body)
        body["carrier"] = "reused-for-another-order"
        jobs.append(replace(source, body=_json(body), kind="reused"))
    bad_bodies = [b"{not json", b"[1, 2, 3]", b'{"order_id": NaN}']
    for n in range(malformed):
        if n % 4 == 3:
            jobs.append(
                Job(
                    message_id=f"{n:04d}" + "x" * 200,
                    body=b'{"order_id": 1}',
                    tenant="",
                    kind="malformed",
                )
            )
        else:
            jobs.append(
                Job(
                    message_id=f"malformed-{n}", body=bad_bodies[n % 3], tenant="", kind="malformed"
                )
            )
    rng.shuffle(jobs)
    return jobs


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _database_url(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


async def _prepare_database(settings: Settings) -> str:
    admin = await asyncpg.connect(settings.database.url, timeout=ANSWER_S)
    try:
        await admin.execute(
            f'DROP DATABASE IF EXISTS "{DEMO_DATABASE}" WITH (FORCE)', timeout=ANSWER_S
        )
        await admin.execute(f'CREATE DATABASE "{DEMO_DATABASE}"', timeout=ANSWER_S)
    finally:
        await admin.close()
    url = _database_url(settings.database.url, DEMO_DATABASE)
    conn = await asyncpg.connect(url, timeout=ANSWER_S)
    try:
        await migrate(conn, "public")
        await conn.execute(
            "CREATE TABLE demo_effects (id bigserial PRIMARY KEY, tenant text NOT NULL,"
            " message_id text NOT NULL, order_id integer NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())",
            timeout=ANSWER_S,
        )
        await conn.execute("CREATE TABLE demo_devices (token text PRIMARY KEY)", timeout=ANSWER_S)
        await conn.execute(
            "CREATE TABLE demo_pruned (token text NOT NULL, reason text NOT NULL)", timeout=ANSWER_S
        )
    finally:
        await conn.close()
    return url


class Workers:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.kills = 0

    def start(self) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"worker-{len(self.procs)}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "consumers", "run", "proving.demo.app:app"],
            env=self.env,
            stdout=log,
            stderr=log,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.kills += 1

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _read_dead_letters(url: str) -> Counter[tuple[str, str]]:
    """(reason, message_id) of every dead letter, taken off the demo's DLQ."""
    connection = await aio_pika.connect(url, timeout=ANSWER_S)
    found: Counter[tuple[str, str]] = Counter()
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel())
        dlq = await channel.get_queue(dead_letter_queue(QUEUE), ensure=True)
        while (message := await dlq.get(no_ack=True, fail=False, timeout=ANSWER_S)) is not None:
            reason = str((message.headers or {}).get(REASON_HEADER, "broker"))
            found[(reason, message.message_id or "")] += 1
    finally:
        await connection.close()
    return found


async def run_demo(
    settings: Settings, *, jobs: int = 10_000, pushes: int = 1_000, workers: int = 2
) -> int:
    started = time.monotonic()
    rng = random.Random(1042)
    planned = plan_jobs(jobs, rng)
    push_plan = plan_pushes(pushes, rng)
    direct_pushes, http_pushes = split_jobs(push_plan.jobs, rng)
    well_formed = [j for j in planned if j.kind != "malformed"]
    unique = {(j.tenant, j.message_id) for j in well_formed}
    expected_dead = sum(1 for j in planned if j.kind in ("reused", "malformed"))
    # One follow-up push job per such order, emitted with its effect (proving.demo.app).
    follow_ups = {
        f"{j.message_id}:push"
        for j in well_formed
        if j.kind == "original" and follows_up(json.loads(j.body)["order_id"])
    }
    push_plan = replace(push_plan, targets=push_plan.targets + len(follow_ups))
    print(
        f"demo: {len(planned)} jobs planned: {len(unique)} distinct orders, "
        f"{Counter(j.kind for j in planned)}; {len(push_plan.jobs)} push jobs for "
        f"{push_plan.targets} devices ({len(push_plan.dead_tokens)} of them dead), "
        f"{len(follow_ups)} of them follow-ups the order handler emits; "
        f"{len(http_pushes)} of the push jobs go in over HTTP through serve"
    )

    db_url = await _prepare_database(settings)
    connection = await aio_pika.connect(settings.amqp.url, timeout=ANSWER_S)
    channel = await within(ANSWER_S, "a channel", connection.channel())
    for queue in (QUEUE, PUSH_QUEUE):
        await delete(channel, queue, app.specs[queue].retry)
        await declare(channel, queue, app.specs[queue].retry, settings.amqp)
    await connection.close()
    fakes = DemoFakes(push_plan)
    await fakes.__aenter__()

    log_dir = Path(tempfile.mkdtemp(prefix="iw-demo-"))
    env = {
        **os.environ,
        "AMQP_URL": settings.amqp.url,
        "DATABASE_URL": db_url,
        "DATABASE_SCHEMA": "public",
        "IW_SHUTDOWN_GRACE": "20",
        "IW_RELAY": "1",  # each worker relays the outbox too: two relays share it
        **fakes.worker_env(),
    }
    pool = Workers(env, log_dir)
    procs = [pool.start() for _ in range(workers)]
    serve = Serve(env, log_dir, PUSH_QUEUE)
    db = await asyncpg.connect(db_url, timeout=ANSWER_S)
    publisher, pub_connection = await within(
        ANSWER_S, "the demo publisher's connection", Publisher.connect(settings.amqp.url)
    )
    try:
        print(f"demo: {workers} workers started (logs in {log_dir}); publishing...")

        async def publish_all() -> None:
            for chunk in range(0, len(planned), 200):
                await asyncio.gather(
                    *(
                        publisher.publish_message(QUEUE, _message(job))
                        for job in planned[chunk : chunk + 200]
                    )
                )
            for chunk in range(0, len(direct_pushes), 200):
                await asyncio.gather(
                    *(
                        publisher.publish(PUSH_QUEUE, body, message_id=message_id)
                        for message_id, body in direct_pushes[chunk : chunk + 200]
                    )
                )
            print(
                f"demo: published {len(planned)} jobs and {len(direct_pushes)} push jobs "
                f"({time.monotonic() - started:.1f} s)"
            )

        async def send_over_http() -> IngressTally:
            url = await serve.url()
            tally = await send_all(url, await create_key(db_url), http_pushes, rng)
            print(
                f"demo: sent {len(http_pushes)} push jobs through serve at {url} in "
                f"{tally.requests} requests ({time.monotonic() - started:.1f} s)"
            )
            return tally

        publishing = asyncio.create_task(publish_all())
        sending = asyncio.create_task(send_over_http())
        killed = False
        deadline = time.monotonic() + 180
        last_print = 0.0
        while time.monotonic() < deadline:
            effects = await db.fetchval("SELECT count(*) FROM demo_effects", timeout=ANSWER_S)
            if not killed and effects >= len(unique) * 0.4:
                victim = procs[0]
                pool.kill(victim)
                print(
                    f"demo: SIGKILLed worker pid {victim.pid} at {effects} effects; restarting it"
                )
                procs[0] = pool.start()
                killed = True
            settled = await settled_targets(db)
            if time.monotonic() - last_print >= 1.0:
                print(
                    f"demo: progress {effects}/{len(unique)} effects, "
                    f"{settled}/{push_plan.targets} pushes settled "
                    f"({time.monotonic() - started:.1f} s)",
                    flush=True,
                )
                last_print = time.monotonic()
            if (
                killed
                and effects >= len(unique)
                and settled >= push_plan.targets
                and await _dead_letters_ready(settings.amqp.url) >= expected_dead
            ):
                break
            await asyncio.sleep(0.05)
        # Both end well before the drain above does, or never.
        await within(ANSWER_S, "the demo's publishes", publishing)
        tally = await within(ANSWER_S, "the demo's jobs sent over HTTP", sending)
        pool.stop_all()
        serve.stop()

        rows = await db.fetch(
            "SELECT tenant, message_id, count(*) AS c FROM demo_effects GROUP BY 1, 2",
            timeout=ANSWER_S,
        )
        report = await push_report(db, fakes, push_plan)
        outbox = await outbox_report(db, follow_ups)
        http_report = await ingress_report(db, tally, http_pushes, PUSH_QUEUE)
    finally:
        pool.stop_all()
        serve.stop()
        await db.close()
        await pub_connection.close()
        await fakes.__aexit__(None, None, None)

    dead = await _read_dead_letters(settings.amqp.url)
    effect_keys = {(r["tenant"], r["message_id"]) for r in rows}
    effects = sum(r["c"] for r in rows)
    doubled = sum(r["c"] - 1 for r in rows if r["c"] > 1)
    lost = len(unique - effect_keys)
    reused_ids = {mid for (reason, mid) in dead if reason == "message_id_reused"}
    dead_ids = {(reason, mid) for (reason, mid) in dead}
    duplicates_ignored = (
        len(well_formed)
        - effects
        - sum(n for (reason, _), n in dead.items() if reason == "message_id_reused")
    )
    elapsed = time.monotonic() - started

    print()
    print(f"{'published':<36}{len(planned):>10}")
    print(f"{'distinct orders (unique)':<36}{len(unique):>10}")
    print(f"{'effects in demo_effects':<36}{effects:>10}")
    print(f"{'duplicates ignored':<36}{duplicates_ignored:>10}")
    for reason, count in sorted(Counter(r for r, _ in dead_ids).items()):
        print(f"{'dead-lettered: ' + reason:<36}{count:>10}")
    print(f"{'devices to push to':<36}{report.expected:>10}")
    print(f"{'pushes sent (ledger)':<36}{report.sent:>10}")
    print(f"{'pushes failed: dead token':<36}{report.failed:>10}")
    print(f"{'devices pruned by the hook':<36}{report.pruned:>10}")
    print(f"{'provider ids recorded':<36}{report.provider_ids_recorded:>10}")
    unknown = _unknown_outcomes(log_dir)
    print(f"{'extra pushes at the fakes':<36}{report.extra_pushes:>10}")
    print(f"{'  beyond their rows leases':<36}{report.extra_beyond_leases:>10}")
    print(f"{'  of them with another collapse id':<36}{report.extra_with_other_collapse_id:>10}")
    print(f"{'sends with an unknown outcome':<36}{unknown:>10}")
    print(f"{'follow-ups emitted to the outbox':<36}{outbox.enqueued:>10}")
    print(f"{'  published by the relays':<36}{outbox.published:>10}")
    print(f"{'  pushed (ledger settled)':<36}{outbox.emitted:>10}")
    print(f"{'workers SIGKILLed':<36}{pool.kills:>10}")
    print(f"{'lost':<36}{lost:>10}")
    print(f"{'doubled':<36}{doubled:>10}")
    print(f"{'elapsed s':<36}{elapsed:>10.1f}")
    print()
    print(
        f"demo: published={len(planned)} unique={len(unique)} effects={effects} "
        f"duplicates_ignored={duplicates_ignored} reused={len(reused_ids)} "
        f"dead_lettered={len(dead_ids)} lost={lost} doubled={doubled} "
        f"pushes={report.sent} provider_ids_recorded={report.provider_ids_recorded} "
        f"extra_pushes={report.extra_pushes} extra_beyond_leases={report.extra_beyond_leases} "
        f"unknown_outcomes={unknown} "
        f"extra_with_other_collapse_id={report.extra_with_other_collapse_id}"
    )
    print(
        f"outbox: enqueued={outbox.enqueued} published={outbox.published} "
        f"emitted={outbox.emitted} lost={outbox.lost}"
    )
    print(http_report.line())
    ok = lost == 0 and doubled == 0 and effects == len(unique) and report.ok and outbox.ok
    ok = ok and unknown == 0  # nothing but the SIGKILL is a fault here
    ok = ok and http_report.ok
    return 0 if ok else 1


def _unknown_outcomes(log_dir: Path) -> int:
    """Sends the workers logged with an unknown outcome: a timeout or a lost connection.

    The demo injects no such fault, so each one is a defect, like the burst
    that broke the fake APNs' stream limit in the push bench (every request on
    the connection unknown, then sent again). A send re-leased after the
    SIGKILLed worker's lease expired is not one.
    """
    unknown = 0
    for path in sorted(log_dir.glob("worker-*.log")):
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if '"push_deferred"' not in line:
                    continue
                with contextlib.suppress(ValueError):
                    reason = str(json.loads(line).get("reason", ""))
                    unknown += reason != LEASE_EXPIRED and reason.startswith("unknown_outcome")
    return unknown


def _message(job: Job) -> aio_pika.Message:
    return aio_pika.Message(
        job.body,
        message_id=job.message_id,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers={"x-tenant": job.tenant} if job.tenant else None,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxReport:
    expected: int  # follow-ups the plan's orders should emit, once each
    enqueued: int  # outbox rows: one per committed effect that emits
    published: int  # of them marked published by a relay (after the broker's confirm)
    emitted: int  # follow-ups that reached the push handler and were settled in the ledger
    lost: int  # expected follow-ups with no settled push

    @property
    def ok(self) -> bool:
        return self.enqueued == self.published == self.emitted == self.expected


async def outbox_report(
    db: asyncpg.Connection[asyncpg.Record], follow_ups: set[str]
) -> OutboxReport:
    """Read from the outbox table and the send ledger, never from the workers."""
    settled = {
        r["message_id"]
        for r in await db.fetch(
            "SELECT DISTINCT message_id FROM send_ledger"
            " WHERE message_id LIKE '%:push' AND status IN ('sent', 'failed')",
            timeout=ANSWER_S,
        )
    }
    return OutboxReport(
        expected=len(follow_ups),
        # The follow-ups' rows; the send API's jobs share the table (the ingress line counts those).
        enqueued=await db.fetchval(
            "SELECT count(*) FROM outbox WHERE message_id LIKE '%:push'", timeout=ANSWER_S
        ),
        published=await db.fetchval(
            "SELECT count(*) FROM outbox"
            " WHERE message_id LIKE '%:push' AND published_at IS NOT NULL",
            timeout=ANSWER_S,
        ),
        emitted=len(settled & follow_ups),
        lost=len(follow_ups - settled),
    )


async def _dead_letters_ready(url: str) -> int:
    connection = await aio_pika.connect(url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel())
        queue = await channel.declare_queue(
            dead_letter_queue(QUEUE), passive=True, timeout=ANSWER_S
        )
        return queue.declaration_result.message_count or 0
    finally:
        await connection.close()
