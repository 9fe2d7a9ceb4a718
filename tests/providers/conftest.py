"""Fixtures for the provider tests: local fake servers and providers pointed at them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from providers import ApnsProvider, FcmProvider
from providers.fakes.apns import FakeApns
from providers.fakes.fcm import FakeFcm


@pytest.fixture
async def apns(fake_apns: FakeApns) -> AsyncIterator[ApnsProvider]:
    """An ApnsProvider on one connection to the fake, with a 2 s timeout."""
    provider = ApnsProvider(fake_apns.settings(timeout_seconds=2.0, max_connections=1))
    yield provider
    await provider.aclose()


@pytest.fixture
async def fcm(fake_fcm: FakeFcm) -> AsyncIterator[FcmProvider]:
    """An FcmProvider pointed at the fake, with a 2 s timeout."""
    provider = FcmProvider(fake_fcm.settings(timeout_seconds=2.0, max_connections=8))
    yield provider
    await provider.aclose()
