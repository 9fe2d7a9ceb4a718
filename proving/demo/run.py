"""The demo run: two worker processes, a SIGKILL mid-call, duplicates and bad input.

    plan the order jobs (duplicates, reused ids, malformed) and the push jobs
    start the fakes: APNs, FCM, a Web Push service, a webhook receiver, an SMTP server
    register each tenant's webhook endpoints through the real store
    start the workers (each relays the outbox) and `serve`; publish, send over HTTP
    SIGKILL one worker while it has calls on the wire, read what it held; restart it
    wait until every effect, push, webhook and e-mail is settled, stop everything
    count: from the effect table, the dead-letter queue, the ledger and the outbox,
    and at each receiver what arrived, what arrived twice, and what the kill explains

Everything the report says is read back from PostgreSQL, RabbitMQ and the
receivers, never from the workers' own counters.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from consumers import Publisher, Settings
from consumers.broker.topology import declare, delete
from dedupe import migrate
from proving.crash_window import Death, answers_lost
from proving.deadlines import ANSWER_S, within
from proving.demo.app import (
    EMAIL_QUEUE,
    PUSH_QUEUE,
    QUEUE,
    WEBHOOK_QUEUE,
    app,
    follows_up,
    sends_email,
    sends_webhook,
)
from proving.demo.emails import DemoEmail
from proving.demo.ingress import (
    IngressTally,
    Serve,
    create_key,
    ingress_report,
    send_all,
    split_jobs,
)
from proving.demo.local import (
    TENANTS,
    dead_letters_ready,
    order_of,
    outbox_report,
    plan_jobs,
    read_dead_letters,
)
from proving.demo.pushes import (
    DemoFakes,
    plan_pushes,
    push_report,
    settled_targets,
)
from proving.demo.report import Counted, print_report
from proving.demo.webhooks import ENDPOINTS, DemoWebhooks
from proving.demo.workers import Workers, kill_now, unknown_outcomes

DEMO_DATABASE = "idempotent_workers_demo"
DRAIN_S = 180.0  # the whole demo's settling, after which it fails saying what is missing
SEND_QUEUES = (PUSH_QUEUE, WEBHOOK_QUEUE, EMAIL_QUEUE)


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


async def _declare_queues(settings: Settings) -> None:
    connection = await aio_pika.connect(settings.amqp.url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel())
        for queue in (QUEUE, *SEND_QUEUES):
            spec = app.specs[queue]
            await delete(channel, queue, spec.retry)
            await declare(channel, queue, spec.retry, settings.amqp)
    finally:
        await connection.close()


async def run_demo(
    settings: Settings, *, jobs: int = 10_000, pushes: int = 1_000, workers: int = 2
) -> int:
    started = time.monotonic()
    rng = random.Random(1042)
    planned = plan_jobs(jobs, rng)
    well_formed = [j for j in planned if j.kind != "malformed"]
    unique = {(j.tenant, j.message_id) for j in well_formed}
    originals = [j for j in well_formed if j.kind == "original"]
    # One follow-up push job per such order, emitted with its effect (proving.demo.app),
    # and one webhook job per such order, sent to each of its tenant's endpoints.
    follow_ups = {f"{j.message_id}:push" for j in originals if follows_up(order_of(j))}
    webhook_jobs = sum(1 for j in originals if sends_webhook(order_of(j)))
    emailed = [order_of(j) for j in originals if sends_email(order_of(j))]
    expected_dead = sum(1 for j in planned if j.kind in ("reused", "malformed"))

    db_url = await _prepare_database(settings)
    await _declare_queues(settings)
    fakes = await DemoFakes().__aenter__()
    webhooks = await DemoWebhooks().__aenter__()
    email = await DemoEmail().__aenter__()
    email.script(emailed)
    push_plan = plan_pushes(pushes, rng, fakes.webpush)
    fakes.script(push_plan)
    # The send API's door allows the push service's host as the workers do
    # (IW_WEBPUSH_ALLOW_HOSTS, which `serve` reads too).
    direct_pushes, http_pushes = split_jobs(push_plan.jobs, rng)
    push_plan = replace(push_plan, targets=push_plan.targets + len(follow_ups))
    print(
        f"demo: {len(planned)} jobs planned: {len(unique)} distinct orders, "
        f"{Counter(j.kind for j in planned)}; {len(push_plan.jobs)} push jobs for "
        f"{push_plan.targets} targets ({push_plan.subscriptions} of them Web Push subscriptions,"
        f" {len(push_plan.dead_tokens) + len(push_plan.dead_subscriptions)} dead), "
        f"{len(follow_ups)} of them follow-ups the order handler emits; "
        f"{len(http_pushes)} of the push jobs go in over HTTP through serve; "
        f"{webhook_jobs} webhook jobs and {len(emailed)} e-mails the order handler emits"
    )

    log_dir = Path(tempfile.mkdtemp(prefix="iw-demo-"))
    db = await asyncpg.connect(db_url, timeout=ANSWER_S)
    await webhooks.register(db, TENANTS)
    env = {
        **os.environ,
        "AMQP_URL": settings.amqp.url,
        "DATABASE_URL": db_url,
        "DATABASE_SCHEMA": "public",
        "IW_SHUTDOWN_GRACE": "20",
        "IW_RELAY": "1",  # each worker relays the outbox too: two relays share it
        **fakes.worker_env(),
        **webhooks.worker_env(),
        **email.worker_env(),
    }
    pool = Workers(env, log_dir)
    procs = [pool.start() for _ in range(workers)]
    serve = Serve(env, log_dir, PUSH_QUEUE)
    publisher, pub_connection = await within(
        ANSWER_S, "the demo publisher's connection", Publisher.connect(settings.amqp.url)
    )
    deaths: list[Death] = []
    try:
        print(
            f"demo: {workers} workers started (logs in {log_dir}); {len(webhooks.secrets)}"
            f" webhook endpoints registered; publishing..."
        )

        async def publish_all() -> None:
            for chunk in range(0, len(planned), 200):
                await asyncio.gather(
                    *(
                        publisher.publish_message(QUEUE, job.message())
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
        sends = {
            PUSH_QUEUE: push_plan.targets,
            WEBHOOK_QUEUE: webhook_jobs * len(ENDPOINTS),
            EMAIL_QUEUE: len(emailed),
        }
        deadline = time.monotonic() + DRAIN_S
        last_print = 0.0
        while time.monotonic() < deadline:
            effects = await db.fetchval("SELECT count(*) FROM demo_effects", timeout=ANSWER_S)
            settled = {queue: await settled_targets(db, queue) for queue in SEND_QUEUES}
            if not deaths and await kill_now(
                db,
                procs[0].pid,
                unfinished=[q for q in SEND_QUEUES if settled[q] < sends[q]],
                under_way=effects >= len(unique) * 0.4,
                late=sum(settled.values()) >= sum(sends.values()) * 0.6,
            ):
                victim = procs[0]
                deaths.append(await pool.kill(victim, db))
                held = Counter(h.consumer for h in deaths[-1].held)
                print(
                    f"demo: SIGKILLed worker pid {victim.pid} at {effects} effects, holding"
                    f" {held[PUSH_QUEUE]} pushes, {held[WEBHOOK_QUEUE]} webhooks and"
                    f" {held[EMAIL_QUEUE]} e-mails `sending`; restarting it"
                )
                procs[0] = pool.start()
            if time.monotonic() - last_print >= 1.0:
                print(
                    f"demo: progress {effects}/{len(unique)} effects, "
                    f"{settled[PUSH_QUEUE]}/{sends[PUSH_QUEUE]} pushes, "
                    f"{settled[WEBHOOK_QUEUE]}/{sends[WEBHOOK_QUEUE]} webhooks and "
                    f"{settled[EMAIL_QUEUE]}/{sends[EMAIL_QUEUE]} e-mails settled "
                    f"({time.monotonic() - started:.1f} s)",
                    flush=True,
                )
                last_print = time.monotonic()
            if (
                deaths
                and effects >= len(unique)
                and all(settled[q] >= sends[q] for q in SEND_QUEUES)
                and await dead_letters_ready(settings.amqp.url) >= expected_dead
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
        lost = answers_lost(log_dir)  # timeouts: each such call may have arrived twice
        push = await push_report(db, fakes, push_plan, deaths, lost)
        outbox = await outbox_report(db, follow_ups)
        ingress = await ingress_report(db, tally, http_pushes, PUSH_QUEUE)
        hooks = await webhooks.report(
            db, jobs=webhook_jobs, deaths=deaths, log_dir=log_dir, lost_answers=lost
        )
        emails = await email.report(db, jobs=len(emailed), deaths=deaths, lost_answers=lost)
    finally:
        pool.stop_all()
        serve.stop()
        await db.close()
        await pub_connection.close()
        await email.__aexit__(None, None, None)
        await webhooks.__aexit__(None, None, None)
        await fakes.__aexit__(None, None, None)

    dead = await read_dead_letters(settings.amqp.url)
    effect_keys = {(r["tenant"], r["message_id"]) for r in rows}
    ok = print_report(
        Counted(
            planned=planned,
            unique=unique,
            effects=sum(r["c"] for r in rows),
            doubled=sum(r["c"] - 1 for r in rows if r["c"] > 1),
            lost=len(unique - effect_keys),
            dead=dead,
            kills=pool.kills,
            unknown=unknown_outcomes(log_dir),
            elapsed=time.monotonic() - started,
            push=push,
            outbox=outbox,
            ingress=ingress,
            webhooks=hooks,
            email=emails,
        )
    )
    return 0 if ok else 1
