"""The idempotency key of a send: from the body or the `Idempotency-Key` header, one key either way.

The header's bytes are UTF-8 (anything else is 400, never read as Latin-1),
in one of two forms that name the same key:

    Idempotency-Key: order-1042-shipped          plain: the bytes are the key
    Idempotency-Key: "order-1042-shipped"        an RFC 8941 sf-string (the IETF
                                                 Idempotency-Key draft's form)

In the quoted form `\\"` and `\\\\` are the only escapes, as RFC 8941 says;
any other backslash, a missing closing quote, or anything after it is 400.
Unlike RFC 8941 (ASCII only) the quotes may hold any UTF-8, so a key such as
`clé-1042` is one key in every form. A value that starts with `"` is always
read as the quoted form. The body's key is a JSON string; both are compared
once decoded, so the same key in both places is one key.
"""

from __future__ import annotations

from ingress.models import MAX_KEY_BYTES
from ingress.refusals import Refusal, invalid

HEADER = "Idempotency-Key"


def header_key(raw: bytes) -> str:
    """The key the header's bytes name; 400 invalid_request when they name none."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise invalid((HEADER, "not UTF-8")) from None
    if not text.startswith('"'):
        return text
    key, escaped = [], False
    for n, char in enumerate(text[1:], start=1):
        if escaped:
            if char not in '"\\':
                raise invalid((HEADER, 'a quoted key escapes only \\" and \\\\'))
            key.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            if n != len(text) - 1:
                raise invalid((HEADER, "nothing may follow the closing quote"))
            return checked("".join(key), HEADER)
        else:
            key.append(char)
    raise invalid((HEADER, "a quoted key needs its closing quote"))


def checked(key: str, field: str) -> str:
    """`key`, if PostgreSQL's text can hold it and it is 1 to 128 bytes; 400 otherwise."""
    if not key or len(key.encode(errors="surrogatepass")) > MAX_KEY_BYTES:
        raise invalid((field, f"1 to {MAX_KEY_BYTES} bytes of UTF-8"))
    if "\x00" in key:  # PostgreSQL's text cannot hold it: the group's statement would fail
        raise invalid((field, "no NUL (U+0000) character"))
    return key


def one_key(in_body: str | None, in_header: bytes | None) -> str:
    """The request's key; 400 when body and header name two keys, or neither names one."""
    from_header = None if in_header is None else checked(header_key(in_header), HEADER)
    from_body = None if in_body is None else checked(in_body, "idempotency_key")
    if from_body is not None and from_header is not None and from_body != from_header:
        raise invalid(
            ("idempotency_key", "the body and the Idempotency-Key header give different keys")
        )
    key = from_body if from_body is not None else from_header
    if key is None:
        raise Refusal(400, {"error": "idempotency_key_required"})
    return key
