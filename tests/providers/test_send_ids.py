"""send_ids: deterministic, within every limit, per target for apns-id, per job for collapse."""

from __future__ import annotations

import re
import uuid

from hypothesis import given
from hypothesis import strategies as st

from providers import send_ids

keys = st.text(min_size=1, max_size=300)
tokens = st.text(alphabet="0123456789abcdef", min_size=1, max_size=200)
URL_SAFE_B64 = re.compile(r"[A-Za-z0-9_-]{1,32}")
PRINTABLE_ASCII = re.compile(r"[\x21-\x7e]{1,64}")


@given(dedupe_key=keys, token=tokens, collapse_key=st.none() | keys)
def test_ids_fit_every_limit_and_are_stable(
    dedupe_key: str, token: str, collapse_key: str | None
) -> None:
    ids = send_ids(dedupe_key, token, collapse_key=collapse_key)

    assert ids == send_ids(dedupe_key, token, collapse_key=collapse_key)
    assert str(uuid.UUID(ids.effect_id)) == ids.effect_id
    assert len(ids.collapse_id.encode()) <= 64
    assert PRINTABLE_ASCII.fullmatch(ids.collapse_id)
    assert len(ids.fcm_collapse_key.encode()) <= 64
    assert URL_SAFE_B64.fullmatch(ids.webpush_topic)


@given(dedupe_key=keys, first=tokens, second=tokens)
def test_apns_id_is_per_target_and_collapse_ids_per_job(
    dedupe_key: str, first: str, second: str
) -> None:
    a, b = send_ids(dedupe_key, first), send_ids(dedupe_key, second)

    assert (a.effect_id == b.effect_id) == (first == second)
    assert (a.collapse_id, a.fcm_collapse_key, a.webpush_topic) == (
        b.collapse_id,
        b.fcm_collapse_key,
        b.webpush_topic,
    )


@given(first=keys, second=keys, token=tokens)
def test_different_jobs_get_different_ids(first: str, second: str, token: str) -> None:
    if first == second:
        return
    a, b = send_ids(first, token), send_ids(second, token)
    assert a.effect_id != b.effect_id
    assert a.collapse_id != b.collapse_id
    assert a.webpush_topic != b.webpush_topic


def test_short_keys_are_used_as_they_are_and_the_jobs_collapse_key_wins() -> None:
    plain = send_ids("order-1042-shipped", "abc")
    assert plain.collapse_id == plain.webpush_topic == "order-1042-shipped"

    own = send_ids("order-1042-shipped", "abc", collapse_key="order-1042")
    assert own.collapse_id == own.fcm_collapse_key == own.webpush_topic == "order-1042"
    assert (
        own.effect_id == plain.effect_id
    )  # the effect id (apns-id) follows the dedupe key, not the collapse key


def test_ids_are_fixed_forever() -> None:
    """Changing the derivation would change the ids of jobs already in flight."""
    ids = send_ids("shipments:acme:order-1042-shipped", "abc")
    assert ids.effect_id == str(
        uuid.uuid5(uuid.UUID("c74a13a6-1eac-55e1-a09c-c2f131de515e"), ids_key())
    )
    long = send_ids("k" * 100, "abc")
    assert long.collapse_id.startswith("k" * 20 + "~")
    assert len(long.collapse_id) == 64


def ids_key() -> str:
    return "shipments:acme:order-1042-shipped\0abc"


def test_the_webpush_topic_is_the_key_when_it_fits_and_a_hash_of_it_otherwise() -> None:
    """RFC 8030: at most 32 URL-safe base64 characters. A key that does not fit is
    hashed, never cut: two keys alike in their first 32 characters get two topics."""
    fits = "a" * 32
    assert send_ids(fits, "t").webpush_topic == fits
    longer, other = "a" * 32 + "-1", "a" * 32 + "-2"
    topics = {send_ids(k, "t").webpush_topic for k in (fits, longer, other)}
    assert len(topics) == 3
    for key in (longer, "order 1042", "order/1042", "ordre-été"):
        topic = send_ids(key, "t").webpush_topic
        assert URL_SAFE_B64.fullmatch(topic) and len(topic) == 32
        assert not key.startswith(topic) and topic not in key  # derived, not truncated
