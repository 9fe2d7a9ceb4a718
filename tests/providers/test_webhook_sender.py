"""WebhookSender against a real HTTP receiver: what each answer means (providers.webhooks).

Every delivery is verified by the receiver with the `standardwebhooks` package, never
by our code; each test also says how many requests reached it (one call, one attempt).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import AsyncIterator

import pytest
from standardwebhooks import Webhook

from providers import (
    NotStartedInTime,
    PermanentProviderError,
    ProviderReceipt,
    TargetGone,
    TransientProviderError,
    UnknownOutcomeError,
    send_ids,
)
from providers.fakes.webhooks import ReceiverReply, WebhookReceiver
from providers.webhook_call import WebhookCall, webhook_id
from providers.webhooks import MAX_ANSWER_BYTES, WebhookSender
from tests.scripted_http import CLOSE, ScriptedServer

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
OTHER = "whsec_" + base64.b64encode(os.urandom(32)).decode()
BODY = json.dumps({"type": "order.shipped", "data": {"order": 1042}}).encode()
IDS = send_ids("webhooks\0acme\0order-1042-shipped", "ep_test")
TIMEOUT_S = 1.0


@pytest.fixture
async def sender() -> AsyncIterator[WebhookSender]:
    sender = WebhookSender(timeout_seconds=TIMEOUT_S, connect_timeout_seconds=0.5, max_in_flight=4)
    yield sender
    await sender.aclose()


def call(receiver: WebhookReceiver, path: str, *secrets: str) -> WebhookCall:
    receiver.trust(path, *(secrets or (SECRET,)))
    return WebhookCall(url=receiver.url(path), body=BODY, secrets=secrets or (SECRET,))


async def test_a_2xx_is_sent_with_the_webhook_id_and_a_signature_the_library_verifies(
    sender: WebhookSender, webhook_receiver: WebhookReceiver
) -> None:
    before = int(time.time())
    receipt = await sender.send(call(webhook_receiver, "/ok"), IDS)
    assert receipt == ProviderReceipt(provider="webhook", provider_message_id=webhook_id(IDS))
    [got] = webhook_receiver.deliveries
    assert got.verified_with == (SECRET,) and got.body == BODY
    assert got.webhook_id == "msg_" + IDS.effect_id.replace("-", "")
    assert before <= int(got.timestamp) <= int(time.time())
    assert got.headers["content-type"] == "application/json"


async def test_while_a_secret_rotates_both_sign_and_each_verifies_on_its_own(
    sender: WebhookSender, webhook_receiver: WebhookReceiver
) -> None:
    await sender.send(call(webhook_receiver, "/rotating", OTHER, SECRET), IDS)
    [got] = webhook_receiver.deliveries
    assert got.verified_with == (OTHER, SECRET)
    assert len(got.signature.split(" ")) == 2
    for secret in (OTHER, SECRET):  # a receiver holding only one of them
        Webhook(secret).verify(got.body, dict(got.headers))


async def test_the_same_ids_send_the_same_webhook_id_every_attempt(
    sender: WebhookSender, webhook_receiver: WebhookReceiver
) -> None:
    webhook_receiver.script("/flaky", ReceiverReply(status=503), times=1)
    with pytest.raises(TransientProviderError):
        await sender.send(call(webhook_receiver, "/flaky"), IDS)
    await sender.send(call(webhook_receiver, "/flaky"), IDS)
    assert webhook_receiver.counts() == {webhook_id(IDS): 2}


async def test_410_is_target_gone(sender: WebhookSender, webhook_receiver: WebhookReceiver) -> None:
    webhook_receiver.script("/gone", ReceiverReply(status=410))
    with pytest.raises(TargetGone) as gone:
        await sender.send(call(webhook_receiver, "/gone"), IDS)
    assert gone.value.status == 410 and gone.value.reason == "gone: HTTP 410"
    assert len(webhook_receiver.deliveries) == 1


@pytest.mark.parametrize(
    ("status", "retry_after"), [(429, "7"), (503, "2"), (500, None), (408, None)]
)
async def test_429_5xx_and_408_are_transient_with_their_retry_after(
    sender: WebhookSender, webhook_receiver: WebhookReceiver, status: int, retry_after: str | None
) -> None:
    webhook_receiver.script("/busy", ReceiverReply(status=status, retry_after=retry_after))
    with pytest.raises(TransientProviderError) as busy:
        await sender.send(call(webhook_receiver, "/busy"), IDS)
    assert busy.value.status == status
    assert busy.value.retry_after == (None if retry_after is None else float(retry_after))
    assert len(webhook_receiver.deliveries) == 1


@pytest.mark.parametrize("status", [400, 401, 404, 413])
async def test_other_4xx_are_permanent_with_their_status(
    sender: WebhookSender, webhook_receiver: WebhookReceiver, status: int
) -> None:
    webhook_receiver.script("/refuses", ReceiverReply(status=status))
    with pytest.raises(PermanentProviderError) as refused:
        await sender.send(call(webhook_receiver, "/refuses"), IDS)
    assert refused.value.status == status and not isinstance(refused.value, TargetGone)


async def test_a_signature_the_receiver_cannot_verify_is_refused_permanently(
    sender: WebhookSender, webhook_receiver: WebhookReceiver
) -> None:
    webhook_receiver.trust("/strict", OTHER)
    wrong = WebhookCall(url=webhook_receiver.url("/strict"), body=BODY, secrets=(SECRET,))
    with pytest.raises(PermanentProviderError) as refused:
        await sender.send(wrong, IDS)
    assert refused.value.status == 401
    assert len(webhook_receiver.rejected) == 1


async def test_a_redirect_is_not_followed(sender: WebhookSender) -> None:
    async with ScriptedServer([(308, {"location": "/elsewhere"}, {})]) as answer:
        with pytest.raises(PermanentProviderError) as refused:
            await sender.send(WebhookCall(url=answer.url, body=BODY, secrets=(SECRET,)), IDS)
    assert refused.value.status == 308 and "redirect not followed" in refused.value.reason
    assert len(answer.seen) == 1


async def test_a_silent_receiver_is_an_unknown_outcome_within_the_timeout(
    sender: WebhookSender, webhook_receiver: WebhookReceiver
) -> None:
    webhook_receiver.script("/silent", ReceiverReply(hold=True))
    began = time.monotonic()
    with pytest.raises(UnknownOutcomeError):
        await sender.send(call(webhook_receiver, "/silent"), IDS)
    assert time.monotonic() - began < TIMEOUT_S + 0.5
    assert len(webhook_receiver.deliveries) == 1  # it arrived: the outcome is unknown


async def test_a_connection_lost_before_the_answer_is_an_unknown_outcome(
    sender: WebhookSender,
) -> None:
    async with ScriptedServer([CLOSE]) as answer:  # reads the request, closes without a word
        with pytest.raises(UnknownOutcomeError):
            await sender.send(WebhookCall(url=answer.url, body=BODY, secrets=(SECRET,)), IDS)
    assert len(answer.seen) == 1


async def test_a_refused_connection_is_transient_nothing_written(sender: WebhookSender) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    with pytest.raises(TransientProviderError) as refused:
        await sender.send(
            WebhookCall(url=f"http://127.0.0.1:{port}/", body=BODY, secrets=(SECRET,)), IDS
        )
    assert not isinstance(refused.value, NotStartedInTime)


async def test_an_unknown_host_is_transient(sender: WebhookSender) -> None:
    url = "http://no-such-host.invalid/hook"  # RFC 6761: never resolves
    with pytest.raises(TransientProviderError):
        await sender.send(WebhookCall(url=url, body=BODY, secrets=(SECRET,)), IDS)


async def test_a_call_that_cannot_be_answered_before_the_deadline_is_not_started(
    sender: WebhookSender, webhook_receiver: WebhookReceiver
) -> None:
    with pytest.raises(NotStartedInTime):
        await sender.send(
            call(webhook_receiver, "/late"), IDS, deadline=time.monotonic() + TIMEOUT_S / 2
        )
    assert webhook_receiver.deliveries == []


async def test_a_huge_answer_is_read_only_up_to_the_bound(sender: WebhookSender) -> None:
    huge = {"error": "x" * (MAX_ANSWER_BYTES * 16)}
    async with ScriptedServer([(400, {}, huge)]) as answer:
        with pytest.raises(PermanentProviderError) as refused:
            await sender.send(WebhookCall(url=answer.url, body=BODY, secrets=(SECRET,)), IDS)
    assert refused.value.status == 400
    assert len(refused.value.reason) < 200  # a quote of its start, never the body
