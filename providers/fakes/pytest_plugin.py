"""pytest fixtures for your own tests: `fake_apns`, `fake_fcm`, `fake_smtp` and
`fake_payments`, served on 127.0.0.1.

Load it from a conftest.py with `pytest_plugins = ["providers.fakes.pytest_plugin"]`
(or `pytest -p providers.fakes.pytest_plugin`); it needs pytest-asyncio.
Each fixture serves a fresh fake for one test and stops it after:

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

if TYPE_CHECKING:  # aiosmtpd, uvicorn: loaded by the fixtures that need them
    from providers.fakes.payments import FakePayments
    from providers.fakes.smtp import FakeSmtp


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
