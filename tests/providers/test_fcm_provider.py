"""FcmProvider through the real pyfcm against FakeFcm: one POST per attempt, every time."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from providers import (
    FcmProvider,
    InvalidDeviceToken,
    PermanentProviderError,
    Platform,
    ProviderError,
    TransientProviderError,
    UnknownOutcomeError,
    send_ids,
)
from providers.fakes.fcm import FakeFcm
from tests.providers.pushes import fcm_push, ids_for


async def test_success_records_the_message_name_and_sets_collapse_ids(
    fcm: FcmProvider, fake_fcm: FakeFcm
) -> None:
    ids = send_ids("x" * 200, "device-1")  # long enough to be hashed to fit
    receipt = await fcm.send(fcm_push("device-1", Platform.WEB), ids)

    [request] = fake_fcm.requests
    assert receipt.provider == "fcm"
    assert receipt.provider_message_id.startswith(f"projects/{fake_fcm.project_id}/messages/")
    assert request.token == "device-1"
    assert request.collapse_key == ids.fcm_collapse_key
    assert request.tag == ids.fcm_collapse_key
    assert request.apns_collapse_id == ids.collapse_id
    assert request.topic == ids.webpush_topic
    assert len(request.topic) <= 32
    assert request.message["android"]["priority"] == "HIGH"
    assert request.message["android"]["ttl"] == "3600s"
    assert request.message["notification"] == {
        "title": "Your order shipped",
        "body": "It arrives Friday",
    }
    assert request.message["data"] == {"order": "1"}


@pytest.mark.parametrize(
    ("status", "field", "error", "code", "retry_after"),
    [
        (404, "message.token", InvalidDeviceToken, "UNREGISTERED", None),
        (400, "message.token", InvalidDeviceToken, "INVALID_ARGUMENT", None),
        (400, "message.android.ttl", PermanentProviderError, "INVALID_ARGUMENT", None),
        (403, "message.token", PermanentProviderError, "SENDER_ID_MISMATCH", None),
        (429, "message.token", TransientProviderError, "QUOTA_EXCEEDED", 30.0),
        (500, "message.token", TransientProviderError, "INTERNAL", None),
        (503, "message.token", TransientProviderError, "UNAVAILABLE", 5.0),
    ],
)
async def test_error_answers_map_to_the_error_tree_with_one_post(
    fcm: FcmProvider,
    fake_fcm: FakeFcm,
    status: int,
    field: str,
    error: type[ProviderError],
    code: str,
    retry_after: float | None,
) -> None:
    header = int(retry_after) if retry_after is not None else None
    fake_fcm.script("device-1", status=status, field=field, retry_after=header)

    with pytest.raises(error) as raised:
        await fcm.send(fcm_push("device-1"), ids_for("device-1"))

    assert type(raised.value) is error
    assert (raised.value.status, raised.value.reason) == (status, code)
    if isinstance(raised.value, TransientProviderError):
        assert raised.value.retry_after == retry_after
    assert len(fake_fcm.requests) == 1


async def test_persistent_429_with_retry_after_returns_at_once_after_one_post(
    fcm: FcmProvider, fake_fcm: FakeFcm
) -> None:
    fake_fcm.script("device-1", status=429, retry_after=2)
    started = time.monotonic()

    with pytest.raises(TransientProviderError):
        await fcm.send(fcm_push("device-1"), ids_for("device-1"))

    assert time.monotonic() - started < 1.0  # pyfcm alone would sleep and POST again
    assert len(fake_fcm.requests) == 1


async def test_read_timeout_is_unknown_outcome_and_never_reposted(fake_fcm: FakeFcm) -> None:
    fake_fcm.script("slow", latency=1.0)
    provider = FcmProvider(fake_fcm.settings(timeout_seconds=0.3))
    try:
        with pytest.raises(UnknownOutcomeError):
            await provider.send(fcm_push("slow"), ids_for("slow"))
        await asyncio.sleep(1.0)
    finally:
        await provider.aclose()
    assert len(fake_fcm.requests) == 1


async def test_dropped_connection_is_unknown_outcome_and_never_reposted(
    fcm: FcmProvider, fake_fcm: FakeFcm
) -> None:
    fake_fcm.script("dropper", drop=True)

    with pytest.raises(UnknownOutcomeError):
        await fcm.send(fcm_push("dropper"), ids_for("dropper"))

    await asyncio.sleep(0.3)
    assert len(fake_fcm.requests) == 1


async def test_connection_refused_is_transient(fake_fcm: FakeFcm) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    provider = FcmProvider(fake_fcm.settings(base_url=f"http://127.0.0.1:{port}"))
    try:
        # the OAuth token comes from the fake; only the send endpoint is unreachable
        with pytest.raises(TransientProviderError, match="ConnectFailed"):
            await provider.send(fcm_push("device-1"), ids_for("device-1"))
    finally:
        await provider.aclose()
    assert fake_fcm.requests == []


async def test_concurrent_first_sends_all_succeed_once(fcm: FcmProvider, fake_fcm: FakeFcm) -> None:
    tokens = [f"device-{i}" for i in range(40)]

    receipts = await asyncio.gather(*(fcm.send(fcm_push(t), ids_for(t)) for t in tokens))

    assert len({r.provider_message_id for r in receipts}) == 40
    assert sorted(r.token for r in fake_fcm.requests) == sorted(tokens)


async def test_send_after_aclose_is_transient(fcm: FcmProvider, fake_fcm: FakeFcm) -> None:
    await fcm.aclose()
    with pytest.raises(TransientProviderError, match="ProviderClosed"):
        await fcm.send(fcm_push("device-1"), ids_for("device-1"))
    assert fake_fcm.requests == []


async def test_sends_start_no_thread_once_the_token_is_fetched(fake_fcm: FakeFcm) -> None:
    # Issue 56: a thread per send in flight (requests under a pool) cost about 1 ms of
    # CPU per push, twelve times an APNs send; sends run on the caller's event loop.
    provider = FcmProvider(fake_fcm.settings(timeout_seconds=2.0))
    try:
        await provider.send(fcm_push("first"), ids_for("first"))  # the token, fetched
        threads = threading.active_count()
        tokens = [f"device-{i}" for i in range(100)]
        await asyncio.gather(*(provider.send(fcm_push(t), ids_for(t)) for t in tokens))
        assert threading.active_count() == threads
    finally:
        await provider.aclose()
    assert len(fake_fcm.requests) == 101


@pytest.mark.parametrize("status", [307, 308])
async def test_a_redirect_is_not_followed_with_a_second_post(
    fcm: FcmProvider, fake_fcm: FakeFcm, status: int
) -> None:
    # requests follows a 307/308 with the same POST: a second send of one attempt.
    fake_fcm.script("device-1", status=status)

    with pytest.raises(PermanentProviderError) as raised:
        await fcm.send(fcm_push("device-1"), ids_for("device-1"))

    assert raised.value.status == status
    assert len(fake_fcm.requests) == 1
