"""ingress.client against a scripted local server: every row of the retry table."""

from __future__ import annotations

import random
import socket
from typing import Any

import pytest

from ingress.client import Backoff, GaveUp, Refused, SendClient, retry_after_seconds
from tests.scripted_http import CLOSE, HANG, ScriptedServer, Step

JOB = {"targets": [{"platform": "ios", "token": "t"}], "notification": {"title": "hi"}}
QUEUED: Step = (202, {}, {"status": "queued", "id": "m-1"})


class Sleeps:
    """Records the waits instead of waiting them: the server's answers are real."""

    def __init__(self) -> None:
        self.waited: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waited.append(seconds)


def client(url: str, sleeps: Sleeps, **backoff: Any) -> SendClient:
    return SendClient(
        url, api_key="k", timeout_seconds=3.0, backoff=Backoff(**backoff), sleep=sleeps
    )


def keys(server: ScriptedServer) -> set[str]:
    return {s.headers["idempotency-key"] for s in server.seen}


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
async def test_retryable_status_is_retried_with_the_same_key(status: int) -> None:
    sleeps = Sleeps()
    async with (
        ScriptedServer([(status, {}, {"error": "busy"}), QUEUED]) as server,
        client(server.url, sleeps) as c,
    ):
        sent = await c.send(JOB)
    assert (sent.id, sent.status, sent.attempts, sent.replayed) == ("m-1", "queued", 2, False)
    assert len(server.seen) == 2
    assert keys(server) == {sent.idempotency_key}
    assert len(sleeps.waited) == 1


@pytest.mark.parametrize("step", [HANG, CLOSE], ids=["timeout", "connection-dropped"])
async def test_timeouts_and_dropped_connections_are_retried_with_the_same_key(step: Step) -> None:
    sleeps = Sleeps()
    async with ScriptedServer([step, QUEUED]) as server, client(server.url, sleeps) as c:
        sent = await c.send(JOB, idempotency_key="order-1042")
    assert sent.attempts == 2
    assert keys(server) == {"order-1042"}


async def test_connection_refused_is_retried_then_gives_up_after_bounded_attempts() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    sleeps = Sleeps()
    async with client(f"http://127.0.0.1:{port}", sleeps, max_attempts=4) as c:
        with pytest.raises(GaveUp) as gave_up:
            await c.send(JOB)
    assert gave_up.value.attempts == 4
    assert "ConnectError" in gave_up.value.last
    assert len(sleeps.waited) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
async def test_final_refusals_are_never_retried(status: int) -> None:
    sleeps = Sleeps()
    async with (
        ScriptedServer([(status, {}, {"error": "nope"}), QUEUED]) as server,
        client(server.url, sleeps) as c,
    ):
        with pytest.raises(Refused) as refused:
            await c.send(JOB)
    assert (refused.value.status, refused.value.error) == (status, "nope")
    assert len(server.seen) == 1
    assert sleeps.waited == []


async def test_retry_after_is_honoured() -> None:
    sleeps = Sleeps()
    steps: list[Step] = [(503, {"Retry-After": "7"}, {"error": "unavailable"})]
    steps += [(429, {"Retry-After": "120"}, {"error": "slow down"}), QUEUED]
    async with ScriptedServer(steps) as server, client(server.url, sleeps) as c:
        await c.send(JOB)
    assert sleeps.waited == [7.0, 30.0]  # the second capped at 30 s


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds(None) is None


async def test_attempts_are_bounded_and_backoff_is_full_jitter_capped() -> None:
    sleeps = Sleeps()
    busy: Step = (503, {}, {"error": "unavailable"})
    async with (
        ScriptedServer([busy] * 10) as server,
        client(server.url, sleeps, max_attempts=5, base_seconds=1.0) as c,
    ):
        with pytest.raises(GaveUp) as gave_up:
            await c.send(JOB)
    assert len(server.seen) == 5
    assert gave_up.value.last == "503 unavailable"
    assert [0 <= w <= 2 ** (n) for n, w in enumerate(sleeps.waited)] == [True] * 4
    backoff = Backoff(base_seconds=1.0, rng=random.Random(7))
    draws = [backoff.delay(12, None) for _ in range(500)]
    assert max(draws) <= 30.0 and min(draws) >= 0.0
    assert max(draws) > 25.0 and min(draws) < 5.0  # the full range, not a fixed wait


async def test_one_key_per_call_and_replayed_is_reported() -> None:
    replay = (202, {"Idempotent-Replayed": "true"}, {"status": "duplicate_ignored", "id": "m-1"})
    async with (
        ScriptedServer([QUEUED, replay, QUEUED]) as server,
        client(server.url, Sleeps()) as c,
    ):
        first = await c.send(JOB, idempotency_key="same")
        again = await c.send(JOB, idempotency_key="same")
        other = await c.send(JOB)
    assert (first.replayed, again.replayed, again.status) == (False, True, "duplicate_ignored")
    assert other.idempotency_key not in ("same", "")
    assert [s.headers["idempotency-key"] for s in server.seen][:2] == ["same", "same"]
