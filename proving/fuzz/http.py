"""`python -m proving.fuzz.http`: raw generated requests against POST /v1/messages, no 5xx.

    python -m proving.fuzz.http --inputs 10000

Starts `serve` on a free loopback port over a fresh schema of the configured
PostgreSQL (DATABASE_URL), which it drops after. Requests are bytes written
to raw sockets (keep-alive, a few connections at once), drawn by hypothesis:
keys plain, quoted (RFC 8941) and not UTF-8; bearer keys right, wrong and
missing; content types of every kind; bodies that are push jobs, nearly push
jobs, JSON a parser reads two ways (a key twice, 1e999, NaN, lone
surrogates, NUL), JSON nested deep, and not JSON at all; framed by
Content-Length or chunked. With the database up, every answer must be below
500: one line says how many of each status came, and exit 0 means no 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from consumers import Settings
from dedupe import migrate, quote_ident
from ingress.keys import ApiKeys
from proving.deadlines import ANSWER_S

KEYS = ["k-1", "k-2", "clé-1042-ü", "é" * 64, 'say "hi"', "a\\b"]
CONNECTIONS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class RawRequest:
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    chunked: bool


@dataclass(slots=True, kw_only=True)
class FuzzCount:
    statuses: Counter[int] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def inputs(self) -> int:
        return sum(self.statuses.values())

    @property
    def server_errors(self) -> int:
        """Answers of 500 or more, and connections closed with no answer (status 0)."""
        return sum(n for status, n in self.statuses.items() if status >= 500 or status == 0)

    def line(self) -> str:
        by_status = " ".join(f"{s}={n}" for s, n in sorted(self.statuses.items()))
        return (
            f"http_fuzz: inputs={self.inputs} statuses[{by_status}] 5xx={self.server_errors}"
            f" (0: closed unanswered)"
            f" seconds={self.seconds:.1f}"
        )


def _sf(key: str) -> bytes:
    return ('"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"').encode()


_header_bytes = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_odd_text = st.one_of(st.text(max_size=8), st.sampled_from(["\x00", "\ud800", "é", "a/b", " "]))
_fine_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))


def push_jobs(odd: bool) -> st.SearchStrategy[dict[str, object]]:
    """Push jobs: valid in every field, or (`odd`) with any field possibly not."""
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


_job = st.one_of(push_jobs(odd=False), push_jobs(odd=True))


def _two_ways(raw: bytes, draw_one: int) -> bytes:
    """`raw` (a JSON object) with something a parser may read two ways spliced in."""
    spliced = [
        b'"ttl_seconds":1e999,"ttl_seconds":60,',
        b'"ttl_seconds":NaN,',
        b'"ttl_seconds":' + b"9" * 5000 + b",",
        b'"notification":{"title":"\\ud800"},',
        b'"notification":{"title":"\\u0000"},',
        b'"targets":[],"targets":[{"platform":"ios","token":"x"}],',
        b'"deep":' + b"[" * 3000 + b"]" * 3000 + b",",
    ][draw_one % 7]
    return b"{" + spliced + raw[1:] if raw.startswith(b"{") and len(raw) > 2 else raw


@st.composite
def raw_requests(draw: st.DrawFn, api_key: str) -> RawRequest:
    job = json.dumps(draw(_job), ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    body = draw(
        st.one_of(
            st.just(job),
            st.integers(0, 6).map(lambda n: _two_ways(job, n)),
            st.binary(max_size=200),
            st.integers(1, max(1, len(job))).map(lambda n: job[:n]),
            st.sampled_from([b"[]", b"null", b'"x"', b"{}", b"\xef\xbb\xbf{}", b" "]),
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
    return RawRequest(headers=tuple(headers), body=body, chunked=draw(st.integers(0, 4)) == 0)


def generate(count: int, api_key: str, seed_value: int) -> list[RawRequest]:
    """`count` requests drawn by hypothesis (generation only: nothing to shrink)."""
    drawn: list[RawRequest] = []

    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(raw_requests(api_key))
    def collect(request: RawRequest) -> None:
        drawn.append(request)

    round_seed = seed_value
    while len(drawn) < count:
        seed(round_seed)(collect)()
        round_seed += 1
    return drawn[:count]


def wire(request: RawRequest) -> bytes:
    head = b"POST /v1/messages HTTP/1.1\r\n" + b"".join(
        name + b": " + value + b"\r\n" for name, value in request.headers
    )
    if request.chunked:
        size = f"{len(request.body):x}".encode()
        chunks = (size + b"\r\n" + request.body + b"\r\n") if request.body else b""
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    return head + f"Content-Length: {len(request.body)}\r\n\r\n".encode() + request.body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """The status of one answer, read whole, and whether the server closes after it.

    Status 0: the server closed the connection without answering.
    """
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    except asyncio.IncompleteReadError:
        return 0, True
    lower = head.lower()
    found = re.search(rb"content-length: *(\d+)", lower)
    await asyncio.wait_for(reader.readexactly(int(found[1]) if found else 0), 30)
    return int(head[9:12]), b"connection: close" in lower or found is None


async def run_http_fuzz(url: str, api_key: str, *, inputs: int, seed_value: int = 1) -> FuzzCount:
    """Send `inputs` drawn requests to `url` over a few raw keep-alive connections."""
    requests = generate(inputs, api_key, seed_value)
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    count = FuzzCount()
    started = time.monotonic()
    queue = list(enumerate(requests))

    async def one_connection() -> None:
        streams = None
        while queue:
            _, request = queue.pop()
            if streams is None:
                streams = await asyncio.wait_for(asyncio.open_connection(host, port), ANSWER_S)
            reader, writer = streams
            writer.write(wire(request))
            status, closing = await _answer(reader)
            count.statuses[status] += 1
            if closing:
                writer.close()
                streams = None
        if streams is not None:
            streams[1].close()

    await asyncio.gather(*(one_connection() for _ in range(CONNECTIONS)))
    count.seconds = time.monotonic() - started
    return count


async def _prepared(database_url: str, schema: str) -> str:
    conn = await asyncpg.connect(database_url, timeout=ANSWER_S)
    try:
        await migrate(conn, schema)
        return await ApiKeys(schema).create(conn, "fuzz")
    finally:
        await conn.close()


async def _dropped(database_url: str, schema: str) -> None:
    conn = await asyncpg.connect(database_url, timeout=ANSWER_S)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S)
    finally:
        await conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.fuzz.http", description=__doc__)
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    database_url = Settings.from_env().database.url
    schema = f"fuzz_http_{uuid.uuid4().hex[:8]}"
    key = asyncio.run(_prepared(database_url, schema))
    log = Path(tempfile.mkdtemp(prefix="iw-fuzz-http-")) / "serve.log"
    env = {**os.environ, "DATABASE_URL": database_url, "DATABASE_SCHEMA": schema}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "consumers", "serve", "--host", "127.0.0.1", "--port", "0"],
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"listening on (http://\S+)", log.read_text())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not listen within 60 s: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        count = asyncio.run(run_http_fuzz(found[1], key, inputs=args.inputs, seed_value=args.seed))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        asyncio.run(_dropped(database_url, schema))
    print(count.line())
    return 0 if count.server_errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
