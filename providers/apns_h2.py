"""h2's connection, made cheaper for one request shape: APNs pushes, hundreds in flight.

The client spends most of its CPU per push in h2, so three costs are cut here,
none of them on the wire's meaning:

- HPACK: a push's headers are constant per connection (method, scheme, host,
  topic, push type, priority, the JWT) except its path, apns-id, collapse id
  and expiration. The constant ones go through hpack's encoder (indexed once,
  then one byte each; the encoding of an unchanged set is reused), the unique
  ones are written as literals that never enter the dynamic table, so no table
  lookup or insertion is paid for them.
- Stream counting: h2 walks every stream of the connection on each new one (to
  check the peer's concurrency limit); with n requests in flight that is O(n)
  per push. The number of streams h2 holds bounds the number open, so the walk
  runs only when that bound reaches the limit; and a stream that ended leaves
  h2's table then (as h2's walk would take it out), so the bound is the number
  open and a connection near its limit does not walk on every push.
- Header validation: our request headers are built from validated values, and
  an APNs answer is read for `:status`, `apns-id` and `retry-after` only; h2
  re-checking each header both ways costs more than the request's encoding.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from h2.config import H2Configuration
from h2.connection import H2Connection
from hpack import Encoder

# Written as literals, never indexed: unique to one push (RFC 7541, 6.2.3).
_UNIQUE = frozenset({b"apns-id", b"apns-collapse-id", b"apns-expiration"})
_STATIC = {(b":method", b"POST"): b"\x83", (b":scheme", b"https"): b"\x87"}
_PATH = b"\x04"  # literal without indexing, name :path (static index 4)


def _literal(data: bytes) -> bytes:
    """An HPACK string literal, not Huffman-coded: length (7-bit prefix), then bytes."""
    length = len(data)
    if length < 127:
        return bytes((length,)) + data
    prefix, length = bytearray((127,)), length - 127
    while length >= 128:
        prefix.append(length & 127 | 128)
        length >>= 7
    prefix.append(length)
    return bytes(prefix) + data


class RequestEncoder(Encoder):
    """HPACK for requests: constant headers indexed, unique ones as never-indexed literals."""

    def __init__(self) -> None:
        super().__init__()
        # Encodings of constant sets already in the table: pure references to entries.
        # Valid until an insertion shifts the entries' indices or a resize evicts some.
        self._indexed: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}
        self._names: dict[bytes, bytes] = {}

    def encode(self, headers: Iterable[Any], huffman: bool = False) -> bytes:
        """One header block (h2 hands over bytes): pseudo-headers, constant ones, unique ones."""
        size_update = b""
        if self.header_table.resized:
            self._indexed.clear()
            size_update = super().encode([])
        pseudo: list[bytes] = []
        constants: list[tuple[bytes, bytes]] = []
        unique: list[bytes] = []
        for name, value, *_ in headers:
            if (static := _STATIC.get((name, value))) is not None:
                pseudo.append(static)
            elif name == b":path":
                pseudo.append(_PATH + _literal(value))
            elif name in _UNIQUE:
                unique.append(self._name(name) + _literal(value))
            elif name.startswith(b":"):
                raise ValueError(f"unexpected pseudo-header {name!r}")
            else:
                constants.append((name, value))
        return b"".join((size_update, *pseudo, self._encode_constants(tuple(constants)), *unique))

    def _encode_constants(self, constants: tuple[tuple[bytes, bytes], ...]) -> bytes:
        if (indexed := self._indexed.get(constants)) is not None:
            return indexed
        entries = self.header_table.dynamic_entries
        newest = entries[0] if entries else None
        encoded = super().encode(constants, huffman=False)
        if (entries[0] if entries else None) is not newest:
            self._indexed.clear()  # entries were inserted: every cached index moved
        table = self.header_table
        matches = [table.search(n, v) for n, v in constants]
        if all(m is not None and m[2] is not None for m in matches) and len(self._indexed) < 16:
            # All in the table now, so encoding them again only refers to entries.
            self._indexed[constants] = super().encode(constants, huffman=False)
        return encoded

    def _name(self, name: bytes) -> bytes:
        """A literal never indexed, with a new name (RFC 7541, 6.2.3): the part before its value."""
        if (encoded := self._names.get(name)) is None:
            encoded = self._names[name] = b"\x10" + _literal(name)
        return encoded


class ApnsH2Connection(H2Connection):
    """A client connection with the encoder above and without the per-stream walk."""

    def __init__(self) -> None:
        super().__init__(
            H2Configuration(
                client_side=True,
                header_encoding=None,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
                validate_inbound_headers=False,
                normalize_inbound_headers=False,
            )
        )
        self.encoder = RequestEncoder()

    def forget_closed(self, stream_id: int) -> None:
        """Out of the table once closed, as h2's own count (`_open_streams`) takes it out."""
        stream = self.streams.get(stream_id)
        if stream is not None and stream.closed:
            del self.streams[stream_id]
            self._closed_streams[stream_id] = stream.closed_by

    @property
    def open_outbound_streams(self) -> int:
        """An upper bound below the peer's limit; h2's exact count (a walk) only near it."""
        held = len(self.streams)
        if held < self.remote_settings.max_concurrent_streams:
            return held
        return super().open_outbound_streams
