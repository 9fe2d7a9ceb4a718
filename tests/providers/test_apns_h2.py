"""The request encoder's header blocks decode, in sequence, to the headers given."""

from __future__ import annotations

from hpack import Decoder

from providers.apns_h2 import RequestEncoder


def request(n: int, *, jwt: str, priority: str | None) -> list[tuple[bytes, bytes]]:
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"https"),
        (b":path", f"/3/device/{'ab' * 32}{n}".encode()),
        (b"host", b"api.push.apple.com"),
        (b"apns-id", f"00000000-0000-5000-8000-{n:012d}".encode()),
        (b"apns-topic", b"com.example.app"),
        (b"apns-push-type", b"alert"),
        (b"apns-collapse-id", f"order-{n}-shipped~{'x' * 140}".encode()),
    ]
    if priority is not None:
        headers.append((b"apns-priority", priority.encode()))
    headers.append((b"authorization", f"bearer {jwt}".encode()))
    return headers


def test_blocks_decode_to_the_headers_across_new_tokens_priorities_and_resizes() -> None:
    encoder, decoder = RequestEncoder(), Decoder()
    for n in range(300):
        if n == 150:  # the peer shrinks its table: the next block must say so first
            encoder.header_table_size = 256
            decoder.max_allowed_table_size = 256
        headers = request(n, jwt=f"token-{n // 40}" * 20, priority=(None, "10", "5")[n % 3])
        decoded = list(decoder.decode(encoder.encode(headers), raw=True))
        assert decoded[:3] == headers[:3]  # pseudo-headers first, in order
        assert sorted(decoded) == sorted(headers)  # the rest: constant ones, then unique ones


def test_unique_values_never_enter_the_table() -> None:
    encoder, decoder = RequestEncoder(), Decoder()
    for n in range(50):
        decoder.decode(encoder.encode(request(n, jwt="t", priority="10")), raw=True)
    stored = {name for name, _ in decoder.header_table.dynamic_entries}
    assert stored == {b"host", b"apns-topic", b"apns-push-type", b"apns-priority", b"authorization"}
