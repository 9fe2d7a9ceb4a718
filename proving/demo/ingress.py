"""The demo's HTTP part: some push jobs go in through `serve` with the retrying client.

Each of those jobs is sent with its own idempotency key, some of them again
with the same key (a client that lost the answer), one with a key reused for
another body, a few with bodies the worker would refuse. Everything the
report says is read back from PostgreSQL: the keys, messages and outbox rows
the answers name, and the ledger rows of the sends.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from dedupe import DbConnection, job_message_id, parse_message_id
from ingress.client import Refused, SendClient
from ingress.keys import ApiKeys
from proving.deadlines import ANSWER_S

TENANT = "acme"
SHARE = 0.25  # of the distinct push jobs go through serve
RESENDS = 0.2  # of those are sent a second time with the same key
INVALID = 3  # bodies the worker would refuse, each with a fresh key


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressTally:
    requests: int
    accepted: int
    duplicate_ignored: int
    key_reused: int
    invalid: int
    ids: dict[str, set[str]]  # idempotency key -> every message id an answer named

    @property
    def first_ids(self) -> set[str]:
        return {i for ids in self.ids.values() for i in ids}


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressReport:
    tally: IngressTally
    messages: int
    lost: int
    doubled: int

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.doubled == 0

    def line(self) -> str:
        t = self.tally
        return (
            f"ingress: requests={t.requests} accepted={t.accepted} "
            f"duplicate_ignored={t.duplicate_ignored} key_reused={t.key_reused} "
            f"invalid={t.invalid} messages={self.messages} lost={self.lost} doubled={self.doubled}"
        )


def split_jobs(
    jobs: list[tuple[str, bytes]], rng: random.Random
) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """(published straight to the queue, sent through serve): a job goes one way only."""
    distinct = sorted({message_id for message_id, _ in jobs})
    through_http = set(rng.sample(distinct, int(len(distinct) * SHARE)))
    direct = [j for j in jobs if j[0] not in through_http]
    http = list({m: (m, b) for m, b in jobs if m in through_http}.values())
    return direct, http


class Serve:
    """`idempotent-workers serve` as a child process of the demo (the workers relay the outbox)."""

    def __init__(self, env: dict[str, str], log_dir: Path, queue: str) -> None:
        self._log = log_dir / "serve.log"
        with self._log.open("ab") as out:
            self.serve = subprocess.Popen(
                [sys.executable, "-m", "consumers", "serve", "--port", "0", "--queue", queue],
                env=env,
                stdout=out,
                stderr=out,
            )

    async def url(self, within_seconds: float = 60.0) -> str:
        deadline = time.monotonic() + within_seconds
        while time.monotonic() < deadline:
            found = re.search(r"listening on (http://\S+)", self._log.read_text())
            if found:
                return found[1]
            if self.serve.poll() is not None:
                raise RuntimeError(f"serve exited: {self._log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        raise RuntimeError("serve did not start listening in time")

    def stop(self) -> None:
        if self.serve.poll() is None:
            self.serve.send_signal(signal.SIGTERM)
        try:
            self.serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.serve.kill()
            self.serve.wait()


async def create_key(db_url: str) -> str:
    conn = await asyncpg.connect(db_url, timeout=ANSWER_S)
    try:
        return await ApiKeys("public").create(conn, TENANT)
    finally:
        await conn.close()


async def send_all(
    url: str, key: str, jobs: list[tuple[str, bytes]], rng: random.Random
) -> IngressTally:
    """Every job once, some twice with the same key, one reused key, a few invalid bodies."""
    plan: list[tuple[str, dict[str, object]]] = [(m, json.loads(b)) for m, b in jobs]
    plan += rng.sample(plan, int(len(plan) * RESENDS))
    rng.shuffle(plan)
    requests = Counter[str]()
    ids: dict[str, set[str]] = {}
    async with SendClient(url, api_key=key, timeout_seconds=30) as client:

        async def one(idempotency_key: str, body: dict[str, object]) -> None:
            requests["requests"] += 1
            try:
                sent = await client.send(body, idempotency_key=idempotency_key)
            except Refused as exc:
                requests["key_reused" if exc.status == 422 else "invalid"] += 1
                return
            requests["duplicate_ignored" if sent.replayed else "accepted"] += 1
            ids.setdefault(idempotency_key, set()).add(sent.id)

        for chunk in range(0, len(plan), 50):
            await asyncio.gather(*(one(k, b) for k, b in plan[chunk : chunk + 50]))
        # One key reused for another body (a client bug: 422, nothing stored) ...
        reused_key, reused_body = plan[0]
        await one(reused_key, {**reused_body, "priority": "high", "ttl_seconds": 1})
        # ... and bodies the worker would refuse (400, nothing stored).
        for n in range(INVALID):
            await one(f"demo-invalid-{n}", {"targets": [{"platform": "pager", "token": str(n)}]})
    return IngressTally(
        requests=requests["requests"],
        accepted=requests["accepted"],
        duplicate_ignored=requests["duplicate_ignored"],
        key_reused=requests["key_reused"],
        invalid=requests["invalid"],
        ids=ids,
    )


async def ingress_report(
    db: DbConnection, tally: IngressTally, jobs: list[tuple[str, bytes]], queue: str
) -> IngressReport:
    """Lost: a job with no message, or a message whose devices did not all settle.
    Doubled: a key answered with two ids, a key with two rows, a message with two jobs."""
    keys = {
        r["idempotency_key"]: str(r["message_id"])
        for r in await db.fetch(
            "SELECT idempotency_key, message_id FROM ingress_idempotency_keys WHERE tenant = $1",
            TENANT,
            timeout=ANSWER_S,
        )
    }
    messages = await db.fetchval(
        "SELECT count(*) FROM ingress_messages WHERE tenant = $1", TENANT, timeout=ANSWER_S
    )
    outbox = Counter(
        r["message_id"]
        for r in await db.fetch(
            "SELECT message_id FROM outbox WHERE tenant = $1", TENANT, timeout=ANSWER_S
        )
    )
    settled = Counter(
        r["message_id"]
        for r in await db.fetch(
            "SELECT message_id FROM send_ledger WHERE consumer = $1 AND tenant = $2"
            " AND status IN ('sent', 'failed')",
            queue,
            TENANT,
            timeout=ANSWER_S,
        )
    )
    lost = 0
    for message_id, body in jobs:
        stored = keys.get(message_id)
        parsed = parse_message_id(stored) if stored else None
        targets = len(json.loads(body)["targets"])
        if parsed is None or settled[job_message_id(parsed)] < targets:
            lost += 1
    doubled = sum(len(ids) - 1 for ids in tally.ids.values())
    doubled += sum(n - 1 for n in outbox.values())
    doubled += len(tally.first_ids - set(keys.values()))  # an answer naming an id not kept
    return IngressReport(tally=tally, messages=messages, lost=lost, doubled=doubled)
