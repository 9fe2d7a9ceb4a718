"""The API channel's chaos: charges with an Idempotency-Key to a Stripe-like payments API.

Each job is one charge for a customer of its own (`proving.chaos.channels.payments`),
its Idempotency-Key the ledger row's effect_id. The fake payments API
(`providers.fakes.payments.FakePayments`) keeps keys as Stripe documents: the same
key and parameters within 24 hours get the first answer again, no second charge;
a key still in progress gets 409. Every charge takes the profile's latency (the
key in progress meanwhile, so calls are on the wire when workers die); scripts,
per customer: one 503, one 429 with Retry-After (refused before a charge, so
retried with the key). A tenth of the jobs are published twice. The profile
`api` replays by key after a crash; `api-lookup` asks the API by key first.

This channel must do better than the window: each intent is charged exactly
once, whatever the kills (`charges created per key`, counted by the fake).
Must be 0: keys charged twice, rows not settled or failed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from consumers import api_job_body
from dedupe import DbConnection
from providers.fakes.payments import FakePayments
from proving.chaos.channels.app import API_QUEUE
from proving.chaos.channels.channel import ChannelFindings, effect_job, ledger_rows, settled
from proving.chaos.channels.payments import Payments
from proving.chaos.workload import Job, duplicates_of
from proving.crash_window import Death, Held, answers_lost, tally

_SHARES = ((503, 0.02), (429, 0.02))


class ApiChannel:
    queue = API_QUEUE

    def __init__(self, *, latency_s: float, name: str = "api") -> None:
        self.name = name  # api, or api-lookup: the line says which recovery ran
        self.service = FakePayments()
        self.latency_s = latency_s
        self.jobs = 0

    async def __aenter__(self) -> Self:
        await self.service.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.service.__aexit__(*exc_info)

    async def prepare(self, db: DbConnection) -> None:
        return None

    def plan(self, jobs: int, rng: random.Random) -> list[Job]:
        originals = jobs - jobs // 10
        planned = []
        for n in range(originals):
            customer = f"cus_{n:06d}"
            roll = rng.random()
            for status, share in _SHARES:
                if roll < share:
                    retry_after = 1.0 if status == 429 else None
                    self.service.script(customer, status=status, retry_after=retry_after, times=1)
                    break
                roll -= share
            self.service.script(customer, latency=self.latency_s)
            body = api_job_body(
                Payments, {"amount": 100 + n, "currency": "usd", "customer": customer}
            )
            planned.append(effect_job(self.queue, n, f"charge-{n}", body))
        self.jobs = originals
        return planned + duplicates_of(planned, jobs - originals, rng)

    def worker_env(self, workdir: Path) -> dict[str, str]:
        return {"CHAOS_PAYMENTS_URL": self.service.base_url}

    async def done(self, db: DbConnection) -> bool:
        return await settled(db, self.queue, self.jobs)

    async def count(
        self, db: DbConnection, deaths: Sequence[Death], log_dir: Path
    ) -> ChannelFindings:
        rows = await ledger_rows(db, self.queue)
        created: dict[str, list[float]] = {}
        posts = [r for r in self.service.requests if r.method == "POST"]
        for request in posts:
            if request.status == 200 and not request.replayed and request.key is not None:
                created.setdefault(request.key, []).append(request.received_at)
        keys = {str(r["effect_id"]) for r in rows}
        return ChannelFindings(
            channel=self.name,
            tally=tally(keys, created, deaths, self._key, lost_answers=answers_lost(log_dir)),
            figures={
                "posts": len(posts),
                "replayed": sum(1 for r in posts if r.replayed),
                "in_progress_409": sum(1 for r in posts if r.status == 409),
                "refused_503_429": sum(1 for r in posts if r.status in (503, 429)),
                "lookups": len(self.service.lookups()),
                "charges": len(self.service.charges),
            },
            zero={
                "keys_charged_twice": sum(1 for n in self.service.created_by_key.values() if n > 1),
                "charges_without_row": sum(1 for k in self.service.created_by_key if k not in keys),
                "unsettled": sum(1 for r in rows if r["status"] in ("claimed", "sending"))
                + max(0, self.jobs - len(rows)),
                "failed": sum(1 for r in rows if r["status"] == "failed"),
            },
            exactly_once=True,
        )

    def _key(self, held: Held) -> str | None:
        return held.effect_id if held.consumer == self.queue else None
