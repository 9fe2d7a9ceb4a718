"""The public face of `providers`: every name in __all__ resolves, and nothing else is missing."""

from __future__ import annotations

import importlib

import providers

EXPECTED = {
    "Platform", "Priority", "Target", "Notification", "Push", "SendIds", "send_ids",
    "ProviderReceipt", "Provider", "ProviderError", "TransientProviderError",
    "PermanentProviderError", "InvalidDeviceToken", "UnknownOutcomeError",
    "ApnsProvider", "ApnsSettings", "FcmProvider", "FcmSettings", "RecordingProvider",
}  # fmt: skip


def test_all_lists_the_public_names_and_each_resolves() -> None:
    assert set(providers.__all__) >= EXPECTED
    for name in providers.__all__:
        assert getattr(providers, name) is not None


def test_fakes_are_importable_for_users_tests() -> None:
    fakes_apns = importlib.import_module("providers.fakes.apns")
    fakes_fcm = importlib.import_module("providers.fakes.fcm")
    assert fakes_apns.FakeApns and fakes_fcm.FakeFcm
