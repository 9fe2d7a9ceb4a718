"""pytest fixtures for your own tests: `fake_apns`, `fake_fcm`, `fake_webpush`,
`webhook_receiver`, `fake_smtp` and `fake_payments`, served on 127.0.0.1.

Load it from a conftest.py with `pytest_plugins = ["providers.fakes.pytest_plugin"]`
(or `pytest -p providers.fakes.pytest_plugin`); it needs pytest-asyncio.
Each fixture serves a fresh fake for one test and stops it after (`webhook_receiver`
needs the `webhooks` extra, the others the `push` extra):

    async def test_welcome_push(fake_apns: FakeApns) -> None:
        provider = ApnsProvider(fake_apns.settings())
        ...
        assert len(fake_apns.requests_for(token)) == 1
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest_asyncio

from providers.fakes.apns import FakeApns
from providers.fakes.fcm import FakeFcm
from providers.fakes.webpush import FakeWebPush

if TYPE_CHECKING:  # the webhooks extra, aiosmtpd, uvicorn: loaded by the fixtures
    from providers.fakes.payments import FakePayments
    from providers.fakes.smtp import FakeSmtp
    from providers.fakes.webhooks import WebhookReceiver


@pytest_asyncio.fixture
async def fake_apns() -> AsyncIterator[FakeApns]:
    """A fake APNs (HTTP/2 over TLS with its own CA); `fake_apns.settings()` reaches it."""
    async with FakeApns() as fake:
        yield fake


@pytest_asyncio.fixture
async def fake_fcm() -> AsyncIterator[FakeFcm]:
    """A fake FCM HTTP v1 with OAuth; `fake_fcm.settings()` reaches it."""
    async with FakeFcm() as fake:
        yield fake


@pytest_asyncio.fixture
async def fake_webpush() -> AsyncIterator[FakeWebPush]:
    """A fake Web Push service (HTTPS with its own CA); `fake_webpush.settings()` reaches it,
    `fake_webpush.subscribe(name)` makes a browser's subscription."""
    async with FakeWebPush() as fake:
        yield fake


@pytest_asyncio.fixture
async def webhook_receiver() -> AsyncIterator[WebhookReceiver]:
    """A webhook receiver over real HTTP that verifies every delivery with the
    `standardwebhooks` package; `webhook_receiver.url(path)` reaches it."""
    from providers.fakes.webhooks import WebhookReceiver  # the webhooks extra's

    async with WebhookReceiver() as receiver:
        yield receiver


@pytest_asyncio.fixture
async def fake_smtp() -> AsyncIterator[FakeSmtp]:
    """A fake SMTP server (aiosmtpd, plain text); `fake_smtp.settings()` reaches it."""
    from providers.fakes.smtp import FakeSmtp

    async with FakeSmtp() as fake:
        yield fake


@pytest_asyncio.fixture
async def fake_payments() -> AsyncIterator[FakePayments]:
    """A fake payments API keeping idempotency keys as Stripe does; at `.base_url`."""
    from providers.fakes.payments import FakePayments

    async with FakePayments() as fake:
        yield fake
