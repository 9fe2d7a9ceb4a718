"""The web target of a push job: a Web Push subscription, parsed as the provider checks it."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from consumers import InvalidPushJob, parse_push_job, push_job_body
from consumers.publishing.parts import push_job_parts
from dedupe import PART_TARGETS
from providers import Platform, Target, WebPushKeys, subscription_problem
from providers.webpush_wire import (
    MAX_ENCRYPTED_BYTES,
    MAX_PLAIN_BYTES,
    encrypted_size,
    webpush_body,
)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def p256dh() -> str:
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    return b64(
        key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )


KEYS = {"p256dh": p256dh(), "auth": b64(b"0123456789abcdef")}
ENDPOINT = "https://fcm.googleapis.com/fcm/send/abc:APA91b"


def web(endpoint: str = ENDPOINT, keys: Any = None) -> dict[str, Any]:
    return {"platform": "web", "endpoint": endpoint, "keys": KEYS if keys is None else keys}


def job(*targets: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"targets": list(targets), "notification": {"title": "Shipped"}, **fields}


def test_a_subscription_is_a_web_target_whose_token_is_its_endpoint() -> None:
    parsed = parse_push_job(job({"platform": "ios", "token": "abc"}, web()))
    assert parsed.targets[1] == Target(
        platform=Platform.WEB, token=ENDPOINT, keys=WebPushKeys(**KEYS)
    )
    assert parsed.targets[1].is_webpush and not parsed.targets[0].is_webpush


def test_a_web_target_with_a_token_is_still_an_fcm_web_token() -> None:
    parsed = parse_push_job(job({"platform": "web", "token": "fcm-web-token"}))
    assert parsed.targets == (Target(platform=Platform.WEB, token="fcm-web-token"),)
    assert not parsed.targets[0].is_webpush


def test_a_web_target_with_a_token_and_an_endpoint_is_refused() -> None:
    with pytest.raises(InvalidPushJob, match=r"targets\[0\]: a web target has a token"):
        parse_push_job(job({**web(), "token": "fcm-web-token"}))


def test_a_subscription_named_twice_gets_one_push_and_with_other_keys_is_refused() -> None:
    assert len(parse_push_job(job(web(), web())).targets) == 1
    other = {"p256dh": p256dh(), "auth": KEYS["auth"]}
    with pytest.raises(InvalidPushJob, match=r"targets\[1\]: the same endpoint"):
        parse_push_job(job(web(), web(keys=other)))


def test_a_private_endpoint_is_refused_unless_allowed() -> None:
    local = web("https://127.0.0.1:8443/push/1")
    with pytest.raises(InvalidPushJob, match=r"targets\[0\]\.endpoint: a public host"):
        parse_push_job(job(local))
    assert parse_push_job(job(local), allow_hosts=frozenset({"127.0.0.1"})).targets


def test_a_web_payload_over_4096_bytes_encrypted_is_refused_with_its_size() -> None:
    def sized(n: int, target: dict[str, Any]) -> dict[str, Any]:
        return {"targets": [target], "notification": {"body": "x" * n}}

    # {"body":"x...","tag":"<a topic of 32 at most>"}, encrypted with 103 bytes more
    fits = MAX_PLAIN_BYTES - len('{"body":"","tag":""}') - 32
    one_more = sized(fits + 1, web())
    push = parse_push_job(sized(fits, web()))
    assert encrypted_size(len(webpush_body(push.push_for(push.targets[0]), tag="t" * 32))) == (
        MAX_ENCRYPTED_BYTES
    )
    with pytest.raises(InvalidPushJob, match=r"would be 4,097 bytes encrypted; .* at most 4,096"):
        parse_push_job(one_more)
    # The same payload to Android alone is no web payload.
    assert parse_push_job(sized(fits + 1, {"platform": "android", "token": "a"}))


def test_push_job_body_writes_a_subscription_as_the_browser_gave_it() -> None:
    target = Target(platform=Platform.WEB, token=ENDPOINT, keys=WebPushKeys(**KEYS))
    body = push_job_body(targets=[target], title="Shipped")
    assert body["targets"] == [web()]
    assert parse_push_job(body).targets == (target,)


def test_the_parts_of_a_large_send_keep_each_subscriptions_keys() -> None:
    targets = [web(f"https://push.example.com/p/{n}") for n in range(PART_TARGETS + 1)]
    parts = push_job_parts("blast", job(*targets))
    assert len(parts) == 2
    assert [t for p in parts for t in p.body["targets"]] == targets


# --- the parser and the check agree ------------------------------------------------------


def mostly(common: Any, *rare: Any) -> st.SearchStrategy[Any]:
    """`common` three times in four, else one of `rare`."""
    return st.sampled_from([common] * 3 * len(rare) + list(rare))


hosts = st.sampled_from(
    [
        "push.example.com",
        "fcm.googleapis.com",
        "xn--bcher-kva.example",
        "8.8.8.8",
        "127.0.0.1",
        "10.0.0.7",
        "[::1]",
        "localhost",
        "printer.local",
        "intranet",
        "169.254.169.254",
        "0x7f.1",
        "a..b",
    ]
)
urls = st.builds(
    lambda scheme, userinfo, host, port, path: f"{scheme}://{userinfo}{host}{port}{path}",
    mostly("https", "http", "ftp", "HTTPS"),
    mostly("", "user@", "u:p@"),
    hosts,
    mostly("", ":8443", ":99999", ":x"),
    mostly("/p/1", "/w/?token=AbC", "", "/p#f", "/p q", "/%2e%2e/"),
)
endpoints = st.one_of(urls, urls, urls, st.text(max_size=40), st.none(), st.integers())
b64_of = st.builds(b64, st.binary(min_size=0, max_size=70))
key_sets = st.one_of(
    st.just(KEYS),
    st.just(KEYS),
    st.just(KEYS),
    st.fixed_dictionaries({"p256dh": st.just(KEYS["p256dh"]), "auth": b64_of}),
    st.fixed_dictionaries({"p256dh": b64_of, "auth": st.just(KEYS["auth"])}),
    st.fixed_dictionaries({"p256dh": st.text(max_size=90), "auth": st.text(max_size=30)}),
    st.dictionaries(st.sampled_from(["p256dh", "auth", "x"]), st.just(KEYS["auth"])),
    st.none(),
    st.text(max_size=5),
)
allow = st.frozensets(st.sampled_from(["127.0.0.1", "::1", "localhost", "10.0.0.7"]), max_size=2)


@settings(max_examples=300)
@example(endpoint="https://127.0.0.1:8443/p", keys=KEYS, allow_hosts=frozenset({"127.0.0.1"}))
@example(endpoint="https://[::1]/p", keys=KEYS, allow_hosts=frozenset({"::1"}))
@example(endpoint="http://localhost/p", keys=KEYS, allow_hosts=frozenset({"localhost"}))
@given(endpoint=endpoints, keys=key_sets, allow_hosts=allow)
def test_the_job_parser_refuses_exactly_what_the_subscription_check_refuses(
    endpoint: Any, keys: Any, allow_hosts: frozenset[str]
) -> None:
    problem = subscription_problem(endpoint, keys, allow_hosts=allow_hosts)
    target = {"platform": "web", "endpoint": endpoint, "keys": keys}
    try:
        parsed = parse_push_job(job(target), allow_hosts=allow_hosts)
    except InvalidPushJob as refused:
        assert problem is not None, refused
        assert str(refused) == f"targets[0].{problem}"
    else:
        assert problem is None
        assert parsed.targets[0].token == endpoint and parsed.targets[0].is_webpush
