"""Is this a Web Push subscription we may send to? One pure check, for every door.

A subscription is what a browser's `PushSubscription.toJSON()` gives:

    {"endpoint": "https://fcm.googleapis.com/fcm/send/...",
     "keys": {"p256dh": "BNcRd...", "auth": "tBHI..."}}

`subscription_problem` decides it without the network, so the worker's job
parser (`consumers.jobs.push`), the send API's door and `WebPushProvider.send`
refuse the same things:

- the endpoint: at most MAX_ENDPOINT_CHARS of RFC 3986's characters, `https`,
  a host, no user or password, no fragment;
- its host, unless named in `allow_hosts`: a public DNS name (two labels or
  more, the last one starting with a letter, not under a special-use name such
  as `localhost`, `local` or `internal`), or an IP literal that is global (no
  private, loopback, link-local, shared, reserved or multicast address). An
  endpoint is a URL someone else gave us; we POST to it;
- `p256dh`: base64url of an uncompressed P-256 point (65 bytes, 0x04 first, on
  the curve: RFC 8291 encrypts to it); `auth`: base64url of 16 bytes.

`allow_hosts` (exact host names or IP literals) lifts the host rule only, for
tests and demos whose push service listens on 127.0.0.1; https stays required.
A name's address is not looked up: a public name that resolves to a private
address passes (a resolver or egress proxy in front of the workers is where
that is closed).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Set
from dataclasses import dataclass
from urllib.parse import urlsplit

from providers.push import WebPushKeys

MAX_ENDPOINT_CHARS = 4096
P256DH_BYTES = 65  # an uncompressed P-256 point
AUTH_BYTES = 16
SPECIAL_USE_NAMES = ("localhost", "local", "internal", "home.arpa", "invalid", "test", "alt")

_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+={0,2}")
# P-256 (SEC 2, 2.4.2): y^2 = x^3 - 3x + b over GF(p). A point on it is a key
# RFC 8291 can agree with; anything else fails every encryption to it.
_P = 2**256 - 2**224 + 2**192 + 2**96 - 1
_B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionProblem:
    """Why a subscription is refused: the field (`endpoint`, `keys.p256dh`, `keys.auth`)
    and a reason a person can act on."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


def subscription_problem(
    endpoint: object, keys: object, *, allow_hosts: Set[str] = frozenset()
) -> SubscriptionProblem | None:
    """Why this subscription cannot be sent to, or None when it can (no network used).

    `endpoint` and `keys` are taken as a job's JSON has them: a `WebPushKeys`, or
    a mapping with `p256dh` and `auth` strings."""
    if (problem := endpoint_problem(endpoint, allow_hosts=allow_hosts)) is not None:
        return SubscriptionProblem(field="endpoint", reason=problem)
    p256dh: object
    auth: object
    if isinstance(keys, WebPushKeys):
        p256dh, auth = keys.p256dh, keys.auth
    elif isinstance(keys, dict):
        p256dh, auth = keys.get("p256dh"), keys.get("auth")
    else:
        return SubscriptionProblem(field="keys", reason="an object with p256dh and auth")
    if (problem := _p256dh_problem(p256dh)) is not None:
        return SubscriptionProblem(field="keys.p256dh", reason=problem)
    decoded = _base64url(auth)
    if decoded is None or len(decoded) != AUTH_BYTES:
        reason = f"base64url of the {AUTH_BYTES}-byte auth secret"
        return SubscriptionProblem(field="keys.auth", reason=reason)
    return None


def endpoint_problem(endpoint: object, *, allow_hosts: Set[str] = frozenset()) -> str | None:
    """Why an endpoint URL is refused, or None."""
    if not isinstance(endpoint, str) or not endpoint or len(endpoint) > MAX_ENDPOINT_CHARS:
        return f"a URL of 1 to {MAX_ENDPOINT_CHARS} characters"
    if not _URL_CHARS.fullmatch(endpoint):
        return "a URL of RFC 3986 characters only (no spaces, quotes or backslashes)"
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 (raises ValueError on a port out of range)
    except ValueError:
        return "a well-formed URL"
    if parts.scheme != "https":
        return "an https URL"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "no user or password in the URL"
    if parts.fragment or "#" in endpoint:
        return "no fragment (#) in the URL"
    host = parts.hostname
    if not host:
        return "a URL with a host"
    if host in allow_hosts:
        return None
    return _host_problem(host)


def _host_problem(host: str) -> str | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if not address.is_global or address.is_multicast:
            return f"a public host ({host} is a private, loopback or reserved address)"
        return None
    labels = host.split(".")
    if len(labels) < 2 or not all(_LABEL.fullmatch(label) for label in labels):
        return f"a public host name ({host} is not a fully qualified DNS name)"
    if not labels[-1][0].isalpha():
        return f"a public host name ({host} ends in a numeric label)"
    if any(host == name or host.endswith("." + name) for name in SPECIAL_USE_NAMES):
        return f"a public host name ({host} is a special-use name)"
    return None


def _p256dh_problem(p256dh: object) -> str | None:
    decoded = _base64url(p256dh)
    if decoded is None or len(decoded) != P256DH_BYTES or decoded[0] != 0x04:
        return f"base64url of the {P256DH_BYTES}-byte uncompressed P-256 public key"
    x, y = int.from_bytes(decoded[1:33], "big"), int.from_bytes(decoded[33:], "big")
    if x >= _P or y >= _P or (y * y - (x * x * x - 3 * x + _B)) % _P != 0:
        return "a point on the P-256 curve"
    return None


def _base64url(value: object) -> bytes | None:
    """The bytes of base64url text (padding optional), or None when it is not that."""
    if not isinstance(value, str) or not _BASE64URL.fullmatch(value):
        return None
    text = value.rstrip("=")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
