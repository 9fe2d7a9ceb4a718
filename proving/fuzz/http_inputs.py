"""What `proving.fuzz.http` sends: raw requests to each route of the send API, drawn by hypothesis.

    messages    POST /v1/messages: push jobs, device tokens and Web Push subscriptions
    webhooks    POST /v1/webhooks: webhook jobs
    emails      POST /v1/emails: e-mail jobs
    endpoints   the webhook endpoint routes: POST, GET and DELETE of the collection and
                of ids (the tenant's own, another tenant's, and none), rotate, disable,
                enable; bodies of URLs and event types

For every route: bodies valid in every field, or with any field possibly not,
JSON a parser reads two ways (a key twice, 1e999, NaN, lone surrogates, NUL),
JSON nested deep, and not JSON at all; keys plain, quoted (RFC 8941) and not
UTF-8; bearer keys right, wrong and missing; content types of every kind;
framed by Content-Length or chunked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

KEYS = ["k-1", "k-2", "clé-1042-ü", "é" * 64, 'say "hi"', "a\\b"]
ROUTES = ("messages", "webhooks", "emails", "endpoints")
# A browser's subscription keys: a P-256 point (65 bytes) and a 16-byte secret.
P256DH = "BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM"
AUTH = "tBHItJI5svbpez7KI4CCXg"


@dataclass(frozen=True, slots=True, kw_only=True)
class RawRequest:
    method: bytes
    path: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    chunked: bool


def _sf(key: str) -> bytes:
    return ('"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"').encode()


_header_bytes = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_odd_text = st.one_of(st.text(max_size=8), st.sampled_from(["\x00", "\ud800", "é", "a/b", " "]))
_fine_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | _odd_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_odd_text, inner, max_size=3),
    max_leaves=6,
)


def _field(odd: bool, valid: st.SearchStrategy[Any], *invalid: st.SearchStrategy[Any]) -> Any:
    """`valid`, or (`odd`) any of `valid` and `invalid`."""
    return st.one_of(valid, *invalid) if odd else valid


def push_jobs(odd: bool, *, subscriptions: bool = False) -> st.SearchStrategy[dict[str, object]]:
    """Push jobs: valid in every field, or (`odd`) with any field possibly not.
    `subscriptions`: Web Push subscriptions among the targets too."""
    text = _odd_text if odd else _fine_text.map(lambda t: t[:8])
    token = st.sampled_from(["ios-token-1", "android:tok_1", "t-2"])
    target = st.fixed_dictionaries(
        {
            "platform": st.sampled_from(
                ["ios", "android", "web", "fax"] if odd else ["ios", "web"]
            ),
            "token": st.one_of(token, _odd_text) if odd else token,
        }
    )
    if subscriptions:
        keys = st.fixed_dictionaries(
            {
                "p256dh": _field(odd, st.just(P256DH), st.sampled_from([AUTH, P256DH[:-1], ""])),
                "auth": _field(odd, st.just(AUTH), st.sampled_from([P256DH, "x", "\x00"])),
            },
            optional={"extra": st.integers()} if odd else {},
        )
        endpoint = _field(
            odd,
            st.sampled_from(["https://push.example.com/s/1", "https://fcm.googleapis.com/x"]),
            st.sampled_from(["http://push.example.com/", "https://127.0.0.1/", "https://u@a.b/"]),
            _odd_text,
        )
        subscription = st.fixed_dictionaries(
            {"platform": _field(odd, st.just("web"), st.just("ios")), "endpoint": endpoint},
            optional={"keys": _field(odd, keys, _json), "expirationTime": st.none()},
        )
        target = st.one_of(target, subscription)
    return st.fixed_dictionaries(
        {"targets": st.lists(target, min_size=0 if odd else 1, max_size=3)},
        optional={
            "notification": st.fixed_dictionaries(
                {}, optional={"title": text, "body": text, "data": st.dictionaries(text, text)}
            ),
            "priority": st.sampled_from(["high", "normal", "low", 1] if odd else ["high"]),
            "ttl_seconds": st.one_of(st.integers(-5, 2**40), st.floats())
            if odd
            else st.integers(0, 2**31 - 1),
            "push_type": text if odd else st.sampled_from(["alert", "background"]),
            "collapse_key": text,
            "idempotency_key": st.one_of(st.sampled_from(KEYS), text),
            **({"extra": st.integers()} if odd else {}),
        },
    )


def webhook_jobs(odd: bool) -> st.SearchStrategy[dict[str, object]]:
    """Webhook jobs: valid in every field, or (`odd`) with any field possibly not."""
    return st.fixed_dictionaries(
        {
            "event_type": _field(
                odd, st.sampled_from(["order.shipped", "a.b-c_d"]), _odd_text, _json
            ),
            "payload": _json,
        },
        optional={
            "timestamp": _field(
                odd,
                st.sampled_from(["2026-03-01T12:00:00Z", "2026-03-01T12:00:00.5+01:00"]),
                st.sampled_from(["2026-02-30", "yesterday", ""]),
                _json,
            ),
            "endpoints": _field(
                odd,
                st.lists(st.sampled_from(["ep_a1", "ep_b-2"]), min_size=1, max_size=3),
                st.lists(_odd_text, max_size=3),
                _json,
            ),
            "idempotency_key": st.one_of(st.sampled_from(KEYS), _odd_text),
            **({"extra": st.integers(), "endpoint": st.just("ep_a1")} if odd else {}),
        },
    )


def email_jobs(odd: bool) -> st.SearchStrategy[dict[str, object]]:
    """E-mail jobs: valid in every field, or (`odd`) with any field possibly not."""
    address = st.sampled_from(["ada@example.com", "bob@Example.COM"])
    bad_address = st.sampled_from(["x", "é@a.b", "a@b\r\nBcc: e@x.io", "", "<a@b.c>"])
    mailbox = st.sampled_from(["Shop <shop@example.com>", "s@example.com"])
    return st.fixed_dictionaries(
        {
            "to": _field(
                odd,
                st.lists(address, min_size=1, max_size=3),
                st.lists(st.one_of(address, bad_address, _odd_text), max_size=3),
                _json,
            ),
            "subject": _field(odd, st.just("Shipped"), _odd_text, st.just("a\r\nb"), _json),
            "text": _field(odd, st.just("On its way"), _odd_text, _json),
        },
        optional={
            "html": _field(odd, st.just("<p>On its way</p>"), _json),
            "from": _field(odd, mailbox, bad_address, _json),
            "reply_to": _field(odd, mailbox, bad_address, _json),
            "headers": _field(
                odd,
                st.dictionaries(st.sampled_from(["X-Order", "X-Tag"]), st.just("1042")),
                st.dictionaries(
                    st.sampled_from(["Subject", "Bad Name", "", "X-A"]),
                    st.one_of(_odd_text, st.just("a\nb"), st.integers()),
                ),
                _json,
            ),
            "idempotency_key": st.one_of(st.sampled_from(KEYS), _odd_text),
            **({"extra": st.integers(), "sender": mailbox} if odd else {}),
        },
    )


def endpoint_bodies(odd: bool) -> st.SearchStrategy[dict[str, object]]:
    """What the endpoint routes take: a URL and event types, or an overlap for a rotation."""
    return st.fixed_dictionaries(
        {},
        optional={
            "url": _field(
                odd,
                st.sampled_from(["https://hooks.example.com/x?a=1", "https://[::1]:8443/h"]),
                st.sampled_from(["http://hooks.example.com/", "https://u:p@h.example/", "h"]),
                _odd_text,
                _json,
            ),
            "event_types": _field(
                odd,
                st.lists(st.sampled_from(["order.shipped", "a"]), max_size=3),
                st.lists(_odd_text, max_size=3),
                _json,
            ),
            "overlap_hours": _field(odd, st.floats(0, 48), st.floats(), _json),
            **({"extra": st.integers()} if odd else {}),
        },
    )


def _two_ways(raw: bytes, draw_one: int) -> bytes:
    """`raw` (a JSON object) with something a parser may read two ways spliced in."""
    spliced = [
        b'"ttl_seconds":1e999,"ttl_seconds":60,',
        b'"ttl_seconds":NaN,',
        b'"ttl_seconds":' + b"9" * 5000 + b",",
        b'"notification":{"title":"\\ud800"},',
        b'"payload":{"title":"\\u0000"},',
        b'"targets":[],"targets":[{"platform":"ios","token":"x"}],',
        b'"deep":' + b"[" * 3000 + b"]" * 3000 + b",",
        b'"url":"https://a.example/","url":"https://b.example/",',
    ][draw_one % 8]
    return b"{" + spliced + raw[1:] if raw.startswith(b"{") and len(raw) > 2 else raw


def _endpoint_paths(ids: Sequence[str]) -> st.SearchStrategy[tuple[bytes, bytes]]:
    """A method and a path of the endpoint routes; ids of the tenant's, another's, or none."""
    some_id = st.one_of(
        st.sampled_from([*ids, "ep_0123", "x", "%00", "ep_%2F..", "ep_" + "a" * 200, "%C3%28"]),
        st.text(
            st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="/?#"),
            max_size=12,
        ),
    )
    one = some_id.map(lambda i: f"/v1/webhook-endpoints/{i}".encode())
    action = st.tuples(some_id, st.sampled_from(["rotate", "disable", "enable", "other"])).map(
        lambda pair: f"/v1/webhook-endpoints/{pair[0]}/{pair[1]}".encode()
    )
    collection = st.just(b"/v1/webhook-endpoints")
    return st.one_of(
        st.tuples(st.sampled_from([b"POST"] * 3 + [b"GET", b"PUT"]), collection),
        st.tuples(st.sampled_from([b"GET", b"DELETE", b"PATCH"]), one),
        st.tuples(st.sampled_from([b"POST"] * 4 + [b"GET"]), action),
    )


@st.composite
def raw_requests(
    draw: st.DrawFn, api_key: str, route: str = "messages", ids: Sequence[str] = ()
) -> RawRequest:
    """One request to `route` (one of ROUTES); `ids`: endpoint ids that exist."""
    if route == "messages":
        method, path = b"POST", b"/v1/messages"
        job = draw(
            st.one_of(
                push_jobs(odd=False, subscriptions=True), push_jobs(odd=True, subscriptions=True)
            )
        )
    elif route == "webhooks":
        method, path = b"POST", b"/v1/webhooks"
        job = draw(st.one_of(webhook_jobs(odd=False), webhook_jobs(odd=True)))
    elif route == "emails":
        method, path = b"POST", b"/v1/emails"
        job = draw(st.one_of(email_jobs(odd=False), email_jobs(odd=True)))
    else:
        method, path = draw(_endpoint_paths(ids))
        job = draw(st.one_of(endpoint_bodies(odd=False), endpoint_bodies(odd=True)))
    raw = json.dumps(job, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    body = draw(
        st.one_of(
            st.just(raw),
            st.integers(0, 7).map(lambda n: _two_ways(raw, n)),
            st.binary(max_size=200),
            st.integers(1, max(1, len(raw))).map(lambda n: raw[:n]),
            st.sampled_from([b"[]", b"null", b'"x"', b"{}", b"\xef\xbb\xbf{}", b" ", b""]),
        )
    )
    headers: list[tuple[bytes, bytes]] = [(b"Host", b"fuzz")]
    auth = draw(st.sampled_from(["right"] * 6 + ["wrong", "none", "raw"]))
    if auth == "right":
        headers.append((b"Authorization", f"Bearer {api_key}".encode()))
    elif auth == "wrong":
        headers.append((b"Authorization", b"Bearer iwk_wrong"))
    elif auth == "raw":
        headers.append((b"Authorization", draw(_header_bytes)))
    kind = draw(
        st.one_of(
            st.sampled_from(
                [b"application/json", b"application/json; charset=utf-8", b"text/plain"]
            ),
            st.sampled_from([b"application/x+json", b"", b"application/json;;"]),
            _header_bytes,
        )
    )
    if draw(st.integers(0, 9)):
        headers.append((b"Content-Type", b"application/json" if draw(st.booleans()) else kind))
    key = draw(st.sampled_from(["none", "plain", "quoted", "raw"]))
    if key == "plain":
        headers.append((b"Idempotency-Key", draw(st.sampled_from(KEYS)).encode()))
    elif key == "quoted":
        headers.append((b"Idempotency-Key", _sf(draw(st.sampled_from(KEYS)))))
    elif key == "raw":
        headers.append((b"Idempotency-Key", draw(_header_bytes)))
    if draw(st.integers(0, 4)) == 0:
        headers.append(
            (draw(st.sampled_from([b"X-Any", b"Accept", b"Expect"])), draw(_header_bytes))
        )
    return RawRequest(
        method=method,
        path=path,
        headers=tuple(headers),
        body=body,
        chunked=draw(st.integers(0, 4)) == 0,
    )
