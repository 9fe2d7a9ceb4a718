"""Push sends through the ledger: real aioapns and pyfcm against the local fakes."""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Iterator, MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from consumers import (
    REASON_HEADER,
    App,
    DeadTarget,
    Publisher,
    UnknownOutcome,
    push_job_body,
)
from dedupe import DbConnection
from providers import ApnsProvider, FcmProvider, Platform, PlatformRouter, Provider, Target
from providers.fakes.apns import FakeApns
from providers.fakes.env import fakes_env
from providers.fakes.fcm import FakeFcm
from proving.deadlines import ANSWER_S, deadline
from tests.apps.push_app import FAST_RETRY
from tests.conftest import AMQP_URL, Spawn
from tests.harness import Harness
from tests.support import WorkerProcess, wait_consumers, wait_declared, wait_for

IOS = Target(platform=Platform.IOS, token="ios-token-aaaaaaaaaaaa")
IOS_2 = Target(platform=Platform.IOS, token="ios-token-bbbbbbbbbbbb")
ANDROID = Target(platform=Platform.ANDROID, token="android-token-cccccccc")


@pytest.fixture
async def pruned(db: DbConnection) -> DbConnection:
    await db.execute(
        "CREATE TABLE pruned_devices (token text NOT NULL, reason text NOT NULL,"
        " worker_pid integer NOT NULL)"
    )
    return db


def push_app(
    queue: str,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    *,
    timeout: float = 5.0,
    unknown_outcome: UnknownOutcome = UnknownOutcome.RESEND,
) -> App:
    app = App(retry=FAST_RETRY)

    async def provider() -> Provider:
        return PlatformRouter(
            apns=ApnsProvider(fake_apns.settings(timeout_seconds=timeout)),
            fcm=FcmProvider(fake_fcm.settings(timeout_seconds=timeout)),
        )

    async def prune(tx: DbConnection, dead: DeadTarget) -> None:
        await tx.execute(
            "INSERT INTO pruned_devices (token, reason, worker_pid) VALUES ($1, $2, 0)",
            dead.address,
            dead.reason,
        )

    app.push_handler(
        queue,
        provider=provider,
        on_invalid_token=prune,
        unknown_outcome=unknown_outcome,
        lease_seconds=max(2.0, timeout * 2),
    )
    return app


def job(*targets: Target, collapse_key: str | None = None) -> dict[str, object]:
    return push_job_body(
        targets=list(targets),
        title="Shipped",
        body="Order 1042 is on its way",
        data={"order": "1042"},
        collapse_key=collapse_key,
    )


async def ledger(db: DbConnection) -> list[tuple[str, str, int]]:
    rows = await db.fetch(
        "SELECT address, status, sends FROM send_ledger ORDER BY message_id, target_index"
    )
    return [(r["address"], r["status"], r["sends"]) for r in rows]


async def all_settled(db: DbConnection, n: int) -> bool:
    done = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status IN ('sent', 'failed')")
    return bool(done >= n)


async def test_redelivered_push_is_sent_once(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        body = job(IOS, ANDROID)
        await harness.publish(body, message_id="order-1042-shipped")
        await harness.publish(body, message_id="order-1042-shipped")
        await wait_for(lambda: all_settled(pruned, 2))
        await harness.publish(body, message_id="order-1042-shipped")
        await harness.wait_outcome("duplicate_ignored", 2)
    assert len(fake_apns.requests_for(IOS.token)) == 1
    assert len(fake_fcm.requests_for(ANDROID.token)) == 1
    rows = await pruned.fetch(
        "SELECT status, provider_message_id, effect_id::text FROM send_ledger"
    )
    assert {r["status"] for r in rows} == {"sent"}
    ios_row = next(r for r in rows if r["effect_id"] == fake_apns.requests[0].apns_id)
    assert ios_row["provider_message_id"] == fake_apns.requests[0].apns_id
    fcm_row = next(r for r in rows if r is not ios_row)
    assert fcm_row["provider_message_id"].startswith("projects/")


async def test_ids_are_derived_from_the_dedupe_key_and_collapse_on_the_device(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        await harness.publish(job(IOS, IOS_2, ANDROID), message_id="m-1")
        await harness.publish(job(IOS, collapse_key="order-1042"), message_id="m-2")
        await wait_for(lambda: all_settled(pruned, 4))
    # The two jobs are sent concurrently: tell m-2's request to IOS by its own
    # collapse key, not by arrival order.
    to_ios = fake_apns.requests_for(IOS.token)
    second = [r for r in to_ios if r.collapse_id == "order-1042"]  # the job's own key wins
    first = [r for r in to_ios if r not in second]
    assert (len(first), len(second)) == (1, 1), [r.collapse_id for r in to_ios]
    first_ios = first[0]
    other = fake_apns.requests_for(IOS_2.token)[0]
    assert first_ios.apns_id != other.apns_id  # per target
    assert first_ios.collapse_id == other.collapse_id  # per job
    android = fake_fcm.requests_for(ANDROID.token)[0].message
    assert android["android"]["collapse_key"] == first_ios.collapse_id
    assert android["android"]["notification"]["tag"] == first_ios.collapse_id


async def test_fanout_job_retried_after_partial_send_sends_only_the_missing_target(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    fake_apns.script(IOS_2.token, status=503, times=1)
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        await harness.publish(job(IOS, IOS_2, ANDROID), message_id="fan-out")
        await wait_for(lambda: all_settled(pruned, 3), timeout=15)
    assert len(fake_apns.requests_for(IOS.token)) == 1
    assert [r.apns_id for r in fake_apns.requests_for(IOS_2.token)] == [
        fake_apns.requests_for(IOS_2.token)[0].apns_id
    ] * 2  # the 503, then the retry with the same apns-id
    assert len(fake_fcm.requests_for(ANDROID.token)) == 1
    assert await ledger(pruned) == [
        (IOS.token, "sent", 1),
        (IOS_2.token, "sent", 2),
        (ANDROID.token, "sent", 1),
    ]


async def test_unregistered_token_runs_the_hook_once_and_is_not_retried(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    fake_apns.script(IOS.token, status=410)
    fake_fcm.script(ANDROID.token, status=404)
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        await harness.publish(job(IOS, ANDROID), message_id="to-dead-devices")
        await wait_for(lambda: all_settled(pruned, 2))
        await harness.publish(job(IOS, ANDROID), message_id="to-dead-devices")
        await harness.wait_outcome("duplicate_ignored")
    assert len(fake_apns.requests_for(IOS.token)) == 1
    assert len(fake_fcm.requests_for(ANDROID.token)) == 1
    hooks = await pruned.fetch("SELECT token, reason FROM pruned_devices ORDER BY token")
    assert [(r["token"], r["reason"]) for r in hooks] == [
        (ANDROID.token, "UNREGISTERED"),
        (IOS.token, "Unregistered"),
    ]
    assert {s for _, s, _ in await ledger(pruned)} == {"failed"}
    assert await harness.dead_letters() == []


async def test_a_payload_apns_refuses_fails_its_ios_devices_at_once_and_holds_up_no_job(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    """A job whose data makes the APNs body 100 KB (past the connection's window):
    its iOS device fails for good without a request, its Android device is sent,
    and a job published after it is sent, well before the provider's timeout: on
    main the iOS send waited that long for credit, then was retried."""
    big = push_job_body(
        targets=[IOS, ANDROID], title="Shipped", body="b", data={"pad": "x" * 100_000}
    )
    timeout = 60.0  # the provider's: every wait below ends long before it
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm, timeout=timeout)):
        await harness.publish(big, message_id="too-large-for-apns")
        await harness.publish(job(IOS_2), message_id="after-it")
        await wait_for(lambda: all_settled(pruned, 3), timeout=timeout / 2)
    rows = await pruned.fetch(
        "SELECT message_id, address, status, failure_reason FROM send_ledger"
        " ORDER BY message_id, target_index"
    )
    assert [tuple(r) for r in rows] == [
        ("after-it", IOS_2.token, "sent", None),
        ("too-large-for-apns", IOS.token, "failed", "PayloadTooLarge"),
        ("too-large-for-apns", ANDROID.token, "sent", None),
    ]
    assert fake_apns.requests_for(IOS.token) == []
    assert await pruned.fetchval("SELECT count(*) FROM pruned_devices") == 0  # not a dead token


async def test_a_stop_past_its_grace_ends_while_a_send_waits_for_credit_that_never_comes(
    harness: Harness, pruned: DbConnection, fake_fcm: FakeFcm
) -> None:
    """A server whose window never fits the body (here 1 KB against 2 KB): the send
    is never started, and was tried again on every renewed lease, so a batch
    cancelled at the end of a stop's grace never ended and the stop hung. Now it
    ends within the grace, a provider timeout and a lease renewal's wait."""
    grace, timeout = 1.0, 1.0
    settings = replace(
        harness.settings,
        worker=replace(harness.settings.worker, shutdown_grace_seconds=grace),
    )
    body = push_job_body(targets=[IOS], title="Shipped", body="b", data={"pad": "x" * 2_000})
    async with FakeApns(initial_window_size=1_024) as narrow:
        worker = harness.run(push_app(harness.queue, narrow, fake_fcm, timeout=timeout), settings)
        await worker.start()
        try:
            await harness.publish(body, message_id="never-fits")

            async def sending() -> bool:
                status = await pruned.fetchval("SELECT status FROM send_ledger")
                return bool(status == "sending")

            await wait_for(sending, timeout=30)
        finally:
            lease = max(2.0, timeout * 2)  # push_app's lease_seconds
            async with deadline(grace + timeout + lease + ANSWER_S, "the worker's stop"):
                await worker.stop()
    assert narrow.requests == []  # nothing was written
    assert await pruned.fetchval("SELECT status FROM send_ledger") == "sending"


async def test_429_with_retry_after_is_retried_no_sooner(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    fake_apns.script(IOS.token, status=429, retry_after=1, times=1)
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        await harness.publish(job(IOS), message_id="throttled")
        await wait_for(lambda: all_settled(pruned, 1), timeout=15)
    first, second = fake_apns.requests_for(IOS.token)
    assert second.received_at - first.received_at >= 1.0
    assert first.apns_id == second.apns_id
    assert await ledger(pruned) == [(IOS.token, "sent", 2)]


async def test_5xx_is_retried_with_backoff_until_sent(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    fake_fcm.script(ANDROID.token, status=503, times=2)
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        await harness.publish(job(ANDROID), message_id="flaky")
        await wait_for(lambda: all_settled(pruned, 1), timeout=15)
    times = [r.received_at for r in fake_fcm.requests_for(ANDROID.token)]
    assert len(times) == 3
    assert all(b - a >= 0.2 for a, b in itertools.pairwise(times))  # a tier between
    assert await ledger(pruned) == [(ANDROID.token, "sent", 3)]


@pytest.mark.parametrize("policy", [UnknownOutcome.RESEND, UnknownOutcome.SKIP])
async def test_timeout_applies_the_unknown_outcome_policy(
    harness: Harness,
    policy: UnknownOutcome,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    fake_apns.script(IOS.token, latency=3.0, times=1)  # answers after the 1 s timeout
    app = push_app(harness.queue, fake_apns, fake_fcm, timeout=1.0, unknown_outcome=policy)
    async with harness.run(app):
        await harness.publish(job(IOS), message_id="slow")
        await wait_for(lambda: all_settled(pruned, 1), timeout=20)
    requests = fake_apns.requests_for(IOS.token)
    if policy is UnknownOutcome.RESEND:
        assert len(requests) == 2
        assert requests[0].apns_id == requests[1].apns_id
        assert requests[0].collapse_id == requests[1].collapse_id
        assert await ledger(pruned) == [(IOS.token, "sent", 2)]
    else:
        assert len(requests) == 1
        assert await ledger(pruned) == [(IOS.token, "failed", 1)]


async def test_invalid_push_job_is_dead_lettered_with_its_reason(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        await harness.publish({"targets": []}, message_id="empty")
        await harness.wait_dead_letters(1)
    dead = await harness.dead_letters()
    assert dead[0].headers[REASON_HEADER] == "invalid_push_job"
    assert "targets" in str(dead[0].headers["x-error"])
    assert fake_apns.requests == []


# --- real worker processes -------------------------------------------------


@pytest.fixture
def push_env(
    worker_env: dict[str, str], fake_apns: FakeApns, fake_fcm: FakeFcm, tmp_path: Path
) -> dict[str, str]:
    return {**worker_env, **fakes_env(fake_apns, fake_fcm, tmp_path, "TEST_")}


@pytest.fixture
def spawn_push(push_env: dict[str, str], tmp_path: Path) -> Iterator[Spawn]:
    started: list[WorkerProcess] = []

    def start(extra: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(
            "tests.apps.push_app:app",
            push_env,
            tmp_path / f"push-{len(started)}.log",
            extra_env=extra,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop_now()


async def test_worker_killed_after_provider_accepted_sends_at_most_once_more_with_same_ids(
    pruned: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn_push: Spawn,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    # A short lease, so the second worker may take over soon; the provider's timeout
    # and FCM's 3 s connect timeout fit inside it (no send starts that could not be
    # answered before it ends).
    short_lease = {"TEST_LEASE_SECONDS": "5", "TEST_PROVIDER_TIMEOUT": "1"}
    first = spawn_push({"PROVING_CRASH_AT": "after_send", **short_lease})
    await wait_declared(AMQP_URL, queue_name)
    await publisher.publish(queue_name, job(IOS, ANDROID), message_id="crash-in-send")
    assert await first.wait(timeout=30) == -signal.SIGKILL
    answered = len(fake_apns.requests_for(IOS.token)) + len(fake_fcm.requests_for(ANDROID.token))
    assert answered >= 1  # the answer being recorded when it died
    assert {s for _, s, _ in await ledger(pruned)} == {"sending"}  # nothing recorded

    second = spawn_push(short_lease)
    await wait_for(lambda: all_settled(pruned, 2), timeout=30)
    second.terminate()
    await second.expect_exit(0)
    ios = fake_apns.requests_for(IOS.token)
    android = fake_fcm.requests_for(ANDROID.token)
    # The crash hit while the first answer was being recorded: that device got
    # one extra send; the other had its request on the wire (one extra) or not
    # yet (none). Never more than one extra per device, always the same ids.
    assert {len(ios), len(android)} <= {1, 2}
    assert len(ios) + len(android) >= 3
    assert len({(r.apns_id, r.collapse_id) for r in ios}) == 1
    assert len({r.message["android"]["collapse_key"] for r in android}) == 1
    assert await ledger(pruned) == [(IOS.token, "sent", 2), (ANDROID.token, "sent", 2)]


async def test_same_push_job_delivered_to_four_workers_sends_once_per_target(
    pruned: DbConnection,
    queue_name: str,
    spawn_push: Spawn,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    tokens = [f"ios-race-{n:04d}-xxxxxxxx" for n in range(40)]
    for token in tokens:
        fake_apns.script(token, latency=0.3)  # sends overlap the duplicates' arrival
    # One worker declares the queues and consumes before the others start:
    # RabbitMQ 3.10 closes a connection with 541 INTERNAL_ERROR ({error,noproc} in
    # rabbit_quorum_queue:consume) when it consumes from a quorum queue another
    # connection declared a moment ago, and such a worker exits 3 (seen in
    # test_crash); a supervisor would restart it, these bare workers are not.
    env = {"IW_PREFETCH": "8", "IW_MAX_BATCH": "4"}
    workers = [spawn_push(env)]
    await wait_consumers(AMQP_URL, queue_name, 1)
    workers += [spawn_push(env) for _ in range(3)]
    await wait_consumers(AMQP_URL, queue_name, 4)

    async def publish_all() -> None:
        pub, connection = await Publisher.connect(AMQP_URL)
        try:
            for n, token in enumerate(tokens):
                body = job(Target(platform=Platform.IOS, token=token))
                await pub.publish(queue_name, body, message_id=f"race-{n}")
        finally:
            await connection.close()

    await asyncio.gather(*(publish_all() for _ in range(4)))
    await wait_for(lambda: all_settled(pruned, len(tokens)), timeout=60)
    for worker in workers:  # a drained worker has no send left in flight
        worker.terminate()
    for worker in workers:
        await worker.expect_exit(0)
    assert all(len(fake_apns.requests_for(t)) == 1 for t in tokens), [
        len(fake_apns.requests_for(t)) for t in tokens
    ]
    logs = "".join(w.log_text() for w in workers)
    assert logs.count('"push_sent"') == len(tokens)
    assert '"send_in_progress"' in logs  # duplicates did meet a live lease (the 409 path)
    assert "batch_failed" not in logs


async def test_worker_killed_between_settle_and_ack_redelivers_and_sends_nothing_twice(
    pruned: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn_push: Spawn,
    fake_apns: FakeApns,
) -> None:
    # Jobs settle out of order and their acks go out multiple=True, some held
    # back behind others: a SIGKILL at the third settle (records committed, no
    # ack of that settle sent) leaves settled jobs unacked. Redelivered, they
    # find their rows `sent`: acked as duplicates, nothing sent again.
    tokens = [f"ios-acks-{n:04d}-xxxxxxxx" for n in range(60)]
    for n, token in enumerate(tokens):
        # Answers out of publish order, in 7 waves 0.1 s apart: more than the 50 ms
        # a recording waits for the rest, so even one batch of all 60 settles 7 times.
        fake_apns.script(token, latency=0.1 * (n % 7))
    first = spawn_push({"PROVING_CRASH_AT": "after_commit", "PROVING_CRASH_AFTER": "2"})
    await wait_declared(AMQP_URL, queue_name)
    for n, token in enumerate(tokens):
        body = job(Target(platform=Platform.IOS, token=token))
        await publisher.publish(queue_name, body, message_id=f"acks-{n}")
    assert await first.wait(timeout=30) == -signal.SIGKILL
    recorded = {
        r["address"]
        for r in await pruned.fetch("SELECT address FROM send_ledger WHERE status = 'sent'")
    }
    assert recorded  # the kill came after records committed
    second = spawn_push()
    await wait_for(lambda: all_settled(pruned, len(tokens)), timeout=60)
    # The first worker may have recorded every answer: wait for the redelivered.
    await second.wait_logged("duplicate_ignored")
    second.terminate()
    await second.expect_exit(0)
    # A row recorded `sent` is never sent again; only a send in flight when the
    # first worker died may reach the device twice (its lease taken over).
    for row in await pruned.fetch("SELECT address, status, sends FROM send_ledger"):
        requests = len(fake_apns.requests_for(row["address"]))
        assert row["status"] == "sent"
        assert requests == 1 if row["address"] in recorded else 1 <= requests <= row["sends"]
    assert '"duplicate_ignored"' in second.log_text()  # settled, unacked: redelivered


async def test_a_job_whose_text_holds_a_lone_surrogate_is_dead_lettered_and_sends_nothing(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    """JSON may escape half a UTF-16 pair (`"\\ud800"`), and Python's json reads it
    into a str no UTF-8 encoder takes: no provider's body can carry it. The send
    API refuses such a body at its door; one published straight to the queue is
    dead-lettered as invalid JSON at once (the decoding refuses it), never
    handed to a provider that would fail to encode it on every attempt."""
    raw = (
        b'{"targets": [{"platform": "ios", "token": "%s"}, {"platform": "android",'
        b' "token": "%s"}], "notification": {"title": "Shipped \\ud800", "body": "b"}}'
        % (IOS.token.encode(), ANDROID.token.encode())
    )
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        await harness.publish(raw, message_id="lone-surrogate")
        await harness.publish(job(IOS_2), message_id="after-it")
        await harness.wait_dead_letters(1)
        await wait_for(lambda: all_settled(pruned, 1), timeout=30)
    dead = await harness.dead_letters()
    assert [d.message_id for d in dead] == ["lone-surrogate"]
    assert dead[0].headers[REASON_HEADER] == "invalid_json"
    assert fake_apns.requests_for(IOS.token) == []
    assert fake_fcm.requests == []
    assert await ledger(pruned) == [(IOS_2.token, "sent", 1)]


async def test_an_answer_to_a_lease_taken_over_meanwhile_is_not_recorded_and_prunes_nothing(
    harness: Harness,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    """Another worker takes one target's lease over while APNs holds its answer
    (Unregistered): that answer is the other worker's to record. Ours is logged
    with `recorded: false`, the row keeps the other worker's lease, and the dead
    token is not pruned by us; the job's other target, still ours, is recorded."""
    answer_now = asyncio.Event()
    fake_apns.script(IOS.token, status=410, reason="Unregistered", until=answer_now, times=1)

    async def both_asked() -> bool:
        return bool(fake_apns.requests_for(IOS.token) and fake_apns.requests_for(IOS_2.token))

    def answer_lines() -> dict[str, MutableMapping[str, Any]]:
        return {
            str(e["event"]): e for e in harness.logs if e["event"] in ("push_sent", "invalid_token")
        }

    async def both_logged() -> bool:
        return len(answer_lines()) == 2

    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)):
        await harness.publish(job(IOS, IOS_2), message_id="taken-over")
        await wait_for(both_asked, timeout=30)
        taken = await pruned.execute(
            "UPDATE send_ledger SET lease_owner = 'another-worker',"
            " lease_expires_at = now() + interval '1 hour' WHERE address = $1",
            IOS.token,
        )
        assert taken == "UPDATE 1"
        answer_now.set()
        await wait_for(both_logged, timeout=30)
    lines = answer_lines()
    assert lines["invalid_token"]["recorded"] is False
    assert lines["push_sent"]["recorded"] is True
    rows = await pruned.fetch(
        "SELECT address, status, lease_owner FROM send_ledger ORDER BY target_index"
    )
    assert [tuple(r) for r in rows] == [
        (IOS.token, "sending", "another-worker"),
        (IOS_2.token, "sent", None),
    ]
    assert await pruned.fetchval("SELECT count(*) FROM pruned_devices") == 0
