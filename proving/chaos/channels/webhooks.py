"""The webhook channel's chaos: endpoints per tenant, a receiver that verifies everything.

Each tenant has three endpoints, made by the real store with their secrets
encrypted under a key made for the run: `orders` (takes `order.shipped` only),
`all` and `flaky` (every event; the first FLAKY_SHARE of its deliveries are
answered 503 with Retry-After: 1, then 204); initech also has `gone`, answering
410 (disabled at the first, its rows failed). A tenth of the jobs are published
twice. Every delivery is verified on arrival by the `standardwebhooks` package
(`providers.fakes.webhooks.WebhookReceiver`) and answered after the profile's
latency, so calls are on the wire when workers die.

Counted at the receiver against the ledger (`proving.crash_window`): every
intent (a job and a live endpoint it goes to) delivered, under one webhook-id,
no more often than once plus the kills that had it on the wire (and the answers
the workers logged as lost to a timeout, counted apart). Must be 0: whole
deliveries no trusted secret verified (`rejected`; a body cut short by its
sender's death is counted apart), rows not settled, rows of a
live endpoint failed, rows of `gone` sent, jobs missing an endpoint's row, an
intent seen under two webhook-ids.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from cryptography.fernet import Fernet

from consumers import webhook_job_body
from consumers.jobs.webhook_endpoints import secret_box
from dedupe import DbConnection, WebhookEndpoints
from providers.fakes.webhooks import ReceivedWebhook, ReceiverReply, WebhookReceiver
from proving.chaos.channels.app import WEBHOOK_QUEUE
from proving.chaos.channels.channel import ChannelFindings, effect_job, ledger_rows, settled
from proving.chaos.workload import TENANTS, Job, duplicates_of
from proving.crash_window import (
    Death,
    Held,
    answers_lost,
    tally,
    webhook_id_of,
    webhook_key,
)

FLAKY_SHARE = 0.05
SHIPPED, REFUNDED = "order.shipped", "order.refunded"
# (name, event types it takes: none is every one)
ENDPOINTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("orders", (SHIPPED,)),
    ("all", ()),
    ("flaky", ()),
)
GONE_TENANT = "initech"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Endpoint:
    id: str
    tenant: str
    path: str
    event_types: tuple[str, ...]

    def takes(self, event_type: str) -> bool:
        return not self.event_types or event_type in self.event_types


class WebhookChannel:
    name = "webhooks"
    queue = WEBHOOK_QUEUE

    def __init__(self, *, latency_s: float) -> None:
        self.receiver = WebhookReceiver()
        self.latency_s = latency_s
        self.key = Fernet.generate_key().decode()
        self.endpoints: list[_Endpoint] = []
        self.gone: _Endpoint | None = None
        self.flaky: dict[str, int] = {}  # path -> deliveries answered 503 first
        self.events: dict[tuple[str, str], str] = {}  # (tenant, message_id) -> event type

    async def __aenter__(self) -> Self:
        await self.receiver.__aenter__()
        self.receiver.unscripted = ReceiverReply(latency=self.latency_s)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.receiver.__aexit__(*exc_info)

    async def prepare(self, db: DbConnection) -> None:
        store, box = WebhookEndpoints("public"), secret_box((self.key,))
        named = [(tenant, name, types) for tenant in TENANTS for name, types in ENDPOINTS]
        named.append((GONE_TENANT, "gone", ()))
        for tenant, name, types in named:
            path = f"/{tenant}/{name}"
            url = self.receiver.url(path)
            made, secret = await store.add(db, tenant=tenant, url=url, event_types=types, box=box)
            self.receiver.trust(path, secret)
            endpoint = _Endpoint(id=made.id, tenant=tenant, path=path, event_types=types)
            if name == "gone":
                self.gone = endpoint
                self.receiver.script(path, ReceiverReply(status=410))
            else:
                self.endpoints.append(endpoint)

    def plan(self, jobs: int, rng: random.Random) -> list[Job]:
        originals = jobs - jobs // 10
        planned = []
        for n in range(originals):
            tenant = TENANTS[n % len(TENANTS)]
            event = SHIPPED if rng.random() < 0.7 else REFUNDED
            body = webhook_job_body(event_type=event, payload={"n": n, "amount": n * 7 % 1000})
            message_id = f"hook-{n}"
            self.events[(tenant, message_id)] = event
            planned.append(effect_job(self.queue, n, message_id, body))
        for endpoint in self.endpoints:
            if endpoint.path.endswith("/flaky"):
                times = max(1, int(originals / len(TENANTS) * FLAKY_SHARE))
                self.flaky[endpoint.path] = times
                self.receiver.script(
                    endpoint.path, ReceiverReply(status=503, retry_after="1"), times=times
                )
        return planned + duplicates_of(planned, jobs - originals, rng)

    def worker_env(self, workdir: Path) -> dict[str, str]:
        return {"IW_WEBHOOK_SECRETS_KEY": self.key}

    async def done(self, db: DbConnection) -> bool:
        return await settled(db, self.queue, len(self.events))

    def _taken(self) -> list[ReceivedWebhook]:
        """Deliveries answered 2xx: verified, not the scripted 503s nor the 410s."""
        seen: Counter[str] = Counter()
        taken = []
        for delivery in self.receiver.deliveries:
            seen[delivery.path] += 1
            refused = seen[delivery.path] <= self.flaky.get(delivery.path, 0)
            gone = self.gone is not None and delivery.path == self.gone.path
            if delivery.verified and not refused and not gone:
                taken.append(delivery)
        return taken

    async def count(
        self, db: DbConnection, deaths: Sequence[Death], log_dir: Path
    ) -> ChannelFindings:
        rows = await ledger_rows(db, self.queue)
        gone_id = self.gone.id if self.gone is not None else ""
        live = [r for r in rows if r["address"] != gone_id]
        by_job: dict[tuple[str, str], set[str]] = {}
        for r in live:
            by_job.setdefault((str(r["tenant"]), str(r["message_id"])), set()).add(
                str(r["address"])
            )
        missing = 0
        for (tenant, message_id), event in self.events.items():
            wanted = {e.id for e in self.endpoints if e.tenant == tenant and e.takes(event)}
            missing += len(wanted - by_job.get((tenant, message_id), set()))
        taken = self._taken()
        arrivals: dict[str, list[float]] = {}
        ids_of: dict[tuple[str, int], set[str]] = {}
        for delivery in taken:
            arrivals.setdefault(delivery.webhook_id, []).append(delivery.received_at)
            n = json.loads(delivery.body)["data"]["n"]
            ids_of.setdefault((delivery.path, n), set()).add(delivery.webhook_id)
        intents = {webhook_id_of(str(r["effect_id"])) for r in live}
        lost = {webhook_id_of(e): n for e, n in answers_lost(log_dir).items()}
        rejected = self.receiver.rejected
        cut = [d for d in rejected if len(d.body) < int(d.headers.get("content-length", "0"))]
        return ChannelFindings(
            channel=self.name,
            tally=tally(intents, arrivals, deaths, self._key, lost_answers=lost),
            figures={
                "endpoints": len(self.endpoints) + (self.gone is not None),
                "deliveries": len(self.receiver.deliveries),
                "verified": sum(1 for d in self.receiver.deliveries if d.verified),
                "answered_503": sum(self.flaky.values()),
                "cut_by_kills": len(cut),  # a body cut short: its sender died writing it
                "gone_rows_failed": sum(
                    1 for r in rows if r["address"] == gone_id and r["status"] == "failed"
                ),
            },
            zero={
                "rejected": len(rejected) - len(cut),  # whole, and no secret verified it
                "unsettled": sum(1 for r in rows if r["status"] in ("claimed", "sending")),
                "live_failed": sum(1 for r in live if r["status"] == "failed"),
                "gone_sent": sum(
                    1 for r in rows if r["address"] == gone_id and r["status"] == "sent"
                ),
                "rows_missing": missing,
                "intents_under_two_ids": sum(1 for ids in ids_of.values() if len(ids) > 1),
            },
        )

    def _key(self, held: Held) -> str | None:
        return webhook_key(held) if held.consumer == self.queue else None
