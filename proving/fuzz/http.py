"""`python -m proving.fuzz.http`: raw generated requests against each route of the send API, no 5xx.

    python -m proving.fuzz.http --inputs 10000                   every route, 10,000 each
    python -m proving.fuzz.http --inputs 10000 --route webhooks  one of them

Starts `serve` on a free loopback port over a fresh schema of the configured
PostgreSQL (DATABASE_URL), which it drops after, with every route on: webhook and
e-mail queues and a key for the endpoints' secrets, and endpoints made beforehand (the
tenant's and another tenant's) for the endpoint routes to act on. Requests are
bytes written to raw sockets (keep-alive, a few connections at once), drawn by
hypothesis (`proving.fuzz.http_inputs`: push jobs with tokens and Web Push
subscriptions, webhook and e-mail jobs, endpoint bodies and ids, each nearly right or
wrong in every way). With the database up, every answer must be below 500: one
line per route says how many of each status came, and exit 0 means no 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
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

from consumers import Settings
from consumers.jobs.webhook_endpoints import secret_box
from dedupe import DbConnection, WebhookEndpoints, migrate, quote_ident
from ingress.keys import ApiKeys
from proving.deadlines import ANSWER_S
from proving.fuzz.http_inputs import ROUTES, RawRequest, raw_requests

CONNECTIONS = 4


@dataclass(slots=True, kw_only=True)
class FuzzCount:
    route: str = "messages"
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
            f"http_fuzz: route={self.route} inputs={self.inputs} statuses[{by_status}]"
            f" 5xx={self.server_errors}"
            f" (0: closed unanswered)"
            f" seconds={self.seconds:.1f}"
        )


def generate(
    count: int, api_key: str, seed_value: int, route: str = "messages", ids: Sequence[str] = ()
) -> list[RawRequest]:
    """`count` requests to `route` drawn by hypothesis (generation only: nothing to shrink)."""
    drawn: list[RawRequest] = []

    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(raw_requests(api_key, route, ids))
    def collect(request: RawRequest) -> None:
        drawn.append(request)

    round_seed = seed_value
    while len(drawn) < count:
        seed(round_seed)(collect)()
        round_seed += 1
    return drawn[:count]


def wire(request: RawRequest) -> bytes:
    head = (
        request.method
        + b" "
        + request.path
        + b" HTTP/1.1\r\n"
        + b"".join(name + b": " + value + b"\r\n" for name, value in request.headers)
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


async def run_http_fuzz(
    url: str,
    api_key: str,
    *,
    inputs: int,
    seed_value: int = 1,
    route: str = "messages",
    ids: Sequence[str] = (),
) -> FuzzCount:
    """Send `inputs` requests drawn for `route` to `url` over a few raw keep-alive
    connections; `ids`: webhook endpoint ids that exist (for the endpoint routes)."""
    requests = generate(inputs, api_key, seed_value, route, ids)
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    count = FuzzCount(route=route)
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


async def made_endpoints(conn: DbConnection, schema: str, tenant: str, key: str) -> list[str]:
    """Two endpoints of `tenant` and one of another tenant's, for the endpoint routes to
    act on (made as `webhook endpoint add` makes them); their ids."""
    store, box = WebhookEndpoints(schema), secret_box((key,))
    ids = []
    for owner in (tenant, tenant, f"{tenant}-other"):
        endpoint, _ = await store.add(
            conn, tenant=owner, url="https://hooks.example.com/fuzz", event_types=(), box=box
        )
        ids.append(endpoint.id)
    return ids


async def _prepared(database_url: str, schema: str, key: str) -> tuple[str, list[str]]:
    conn = await asyncpg.connect(database_url, timeout=ANSWER_S)
    try:
        await migrate(conn, schema)
        return await ApiKeys(schema).create(conn, "fuzz"), await made_endpoints(
            conn, schema, "fuzz", key
        )
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
    parser.add_argument("--inputs", type=int, default=10_000, help="requests to each route")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--route", choices=ROUTES, action="append", help="this route only (repeat for more)"
    )
    args = parser.parse_args(argv)
    database_url = Settings.from_env().database.url
    schema = f"fuzz_http_{uuid.uuid4().hex[:8]}"
    from cryptography.fernet import Fernet  # the webhooks extra's, as serve's endpoints need

    secrets_key = Fernet.generate_key().decode()
    api_key, ids = asyncio.run(_prepared(database_url, schema, secrets_key))
    log = Path(tempfile.mkdtemp(prefix="iw-fuzz-http-")) / "serve.log"
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DATABASE_SCHEMA": schema,
        "IW_INGRESS_WEBHOOK_QUEUE": "fuzz.webhooks",
        "IW_INGRESS_EMAIL_QUEUE": "fuzz.emails",
        "IW_WEBHOOK_SECRETS_KEY": secrets_key,
    }
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
        counts = []
        for route in args.route or ROUTES:
            counts.append(
                asyncio.run(
                    run_http_fuzz(
                        found[1],
                        api_key,
                        inputs=args.inputs,
                        seed_value=args.seed,
                        route=route,
                        ids=ids,
                    )
                )
            )
            print(counts[-1].line(), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        asyncio.run(_dropped(database_url, schema))
    return 0 if all(c.server_errors == 0 for c in counts) else 1


if __name__ == "__main__":
    sys.exit(main())
