"""The one check of a Web Push subscription: what it refuses and why."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given
from hypothesis import strategies as st

from providers import WebPushKeys, subscription_problem


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def public_key() -> bytes:
    return (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )


KEYS = WebPushKeys(p256dh=b64(public_key()), auth=b64(b"0123456789abcdef"))
GOOD = "https://fcm.googleapis.com/fcm/send/dQw4w9WgXcQ:APA91bH"


@pytest.mark.parametrize(
    "endpoint",
    [
        GOOD,
        "https://updates.push.services.mozilla.com/wpush/v2/gAAAAABk",
        "https://web.push.apple.com/QGuQyavXutnMH",
        "https://wns2-par02p.notify.windows.com/w/?token=BQYAAAD",
        "https://push.example.com:8443/p/1",
        "https://8.8.8.8/p",
        "https://[2606:4700:4700::1111]/p",
    ],
)
def test_public_https_endpoints_pass(endpoint: str) -> None:
    assert subscription_problem(endpoint, KEYS) is None


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("http://push.example.com/p", "an https URL"),
        ("https://user:secret@push.example.com/p", "no user or password"),
        ("https://user@push.example.com/p", "no user or password"),
        ("https://push.example.com/p#frag", "no fragment"),
        ("https://push.example.com/p q", "RFC 3986 characters"),
        ("https://push.example.com\\@127.0.0.1/", "RFC 3986 characters"),
        ("https:///p", "a URL with a host"),
        ("https://push.example.com:99999/p", "well-formed"),
        ("https://127.0.0.1/p", "private, loopback or reserved"),
        ("https://10.1.2.3/p", "private, loopback or reserved"),
        ("https://192.168.0.1/p", "private, loopback or reserved"),
        ("https://169.254.169.254/latest/meta-data", "private, loopback or reserved"),
        ("https://100.64.0.1/p", "private, loopback or reserved"),
        ("https://[::1]/p", "private, loopback or reserved"),
        ("https://[fe80::1]/p", "private, loopback or reserved"),
        ("https://[::ffff:127.0.0.1]/p", "private, loopback or reserved"),
        ("https://224.0.0.1/p", "private, loopback or reserved"),
        ("https://0.0.0.0/p", "private, loopback or reserved"),
        ("https://localhost/p", "not a fully qualified"),
        ("https://push.localhost/p", "special-use"),
        ("https://printer.local/p", "special-use"),
        ("https://metadata.google.internal/p", "special-use"),
        ("https://intranet/p", "not a fully qualified"),
        ("https://2130706433/p", "not a fully qualified"),
        ("https://0x7f.1/p", "numeric label"),
        ("https://127.1/p", "numeric label"),
        ("", "1 to 4096"),
        ("https://push.example.com/" + "a" * 4096, "1 to 4096"),
    ],
)
def test_endpoints_refused_say_why(endpoint: str, reason: str) -> None:
    problem = subscription_problem(endpoint, KEYS)
    assert problem is not None and problem.field == "endpoint"
    assert reason in problem.reason


def test_the_allow_list_lifts_the_host_rule_only() -> None:
    allow = frozenset({"127.0.0.1", "localhost"})
    assert subscription_problem("https://127.0.0.1:8443/p", KEYS, allow_hosts=allow) is None
    assert subscription_problem("https://localhost/p", KEYS, allow_hosts=allow) is None
    for still_refused in ("http://127.0.0.1/p", "https://u:p@127.0.0.1/p", "https://10.0.0.1/"):
        assert subscription_problem(still_refused, KEYS, allow_hosts=allow) is not None


@pytest.mark.parametrize(
    ("keys", "field"),
    [
        ({"p256dh": KEYS.p256dh}, "keys.auth"),
        ({"auth": KEYS.auth}, "keys.p256dh"),
        ({"p256dh": KEYS.p256dh, "auth": b64(b"short")}, "keys.auth"),
        ({"p256dh": KEYS.p256dh, "auth": b64(bytes(17))}, "keys.auth"),
        ({"p256dh": KEYS.p256dh[:-4], "auth": KEYS.auth}, "keys.p256dh"),
        ({"p256dh": b64(b"\x02" + public_key()[1:]), "auth": KEYS.auth}, "keys.p256dh"),
        ({"p256dh": b64(b"\x04" + bytes(64)), "auth": KEYS.auth}, "keys.p256dh"),  # off curve
        ({"p256dh": "+" + KEYS.p256dh[1:], "auth": KEYS.auth}, "keys.p256dh"),
        ({"p256dh": 7, "auth": KEYS.auth}, "keys.p256dh"),
        ("p256dh=...", "keys"),
    ],
)
def test_keys_refused_name_their_field(keys: object, field: str) -> None:
    problem = subscription_problem(GOOD, keys)
    assert problem is not None and problem.field == field, problem


def test_keys_with_padding_are_taken_as_browsers_may_send_them() -> None:
    padded = {"p256dh": KEYS.p256dh + "=", "auth": KEYS.auth + "=="}
    assert subscription_problem(GOOD, padded) is None


@given(point=st.binary(min_size=64, max_size=64))
def test_the_curve_check_agrees_with_cryptography(point: bytes) -> None:
    """A 65-byte key passes exactly when cryptography takes it as a P-256 point."""
    raw = b"\x04" + point
    try:
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
        valid = True
    except ValueError:
        valid = False
    problem = subscription_problem(GOOD, {"p256dh": b64(raw), "auth": KEYS.auth})
    assert (problem is None) == valid


def test_real_points_pass_the_curve_check() -> None:
    for _ in range(20):
        assert subscription_problem(GOOD, {"p256dh": b64(public_key()), "auth": KEYS.auth}) is None
