"""The Web Push channel's chaos: subscriptions at the run's push service, every request checked.

Each push job names one or two Web Push subscriptions, every one its own, made
at the fake push service (`providers.fakes.webpush.FakeWebPush`), which does
with every request what a browser vendor's service does: verifies the VAPID
JWT, checks the headers, decrypts the payload with the subscription's private
key. Scripts, per subscription: dropped by its browser (410 Gone: the row must
fail), one 429 with Retry-After, one 503; a tenth of the jobs are published
twice. It answers after the profile's latency, so calls are on the wire when
workers die. (The fake APNs and FCM run too, unused: the worker's router is
built as the demo's and the main chaos run's are.)

Counted at the push service against the ledger (`proving.crash_window`), each
subscription of a job an intent: delivered, no more often than once plus the
kills that had it on the wire (and the answers the workers logged as lost to a
timeout, counted apart). Must be 0: requests the service refused (a JWT
that did not verify, a payload that did not decrypt), payloads that decrypt to
another text than the job's, a second request with another Topic than the
first (the collapse key), rows not settled, dead subscriptions not failed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from consumers import push_job_body
from dedupe import DbConnection
from providers.fakes.apns import FakeApns
from providers.fakes.env import fakes_env
from providers.fakes.fcm import FakeFcm
from providers.fakes.webpush import FakeWebPush, WebPushReply, WebPushRequest
from proving.chaos.channels.app import WEBPUSH_QUEUE
from proving.chaos.channels.channel import ChannelFindings, effect_job, ledger_rows, settled
from proving.chaos.workload import Job, duplicates_of
from proving.crash_window import Death, Held, answers_lost, tally

LOCAL = frozenset({"127.0.0.1"})
DEAD, RATE_LIMITED, UNAVAILABLE = "dead", "429", "503"
_SHARES = ((DEAD, 0.02), (RATE_LIMITED, 0.02), (UNAVAILABLE, 0.02))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Subscription:
    name: str
    endpoint: str
    text: str  # the job's notification body, which the payload must decrypt to
    script: str | None


class WebPushChannel:
    name = "webpush"
    queue = WEBPUSH_QUEUE

    def __init__(self, *, latency_s: float) -> None:
        self.service = FakeWebPush(unscripted=WebPushReply(latency=latency_s))
        self.apns = FakeApns()
        self.fcm = FakeFcm()
        self.subscriptions: dict[str, _Subscription] = {}  # by endpoint
        self.jobs = 0

    async def __aenter__(self) -> Self:
        await self.service.__aenter__()
        await self.apns.__aenter__()
        await self.fcm.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.fcm.__aexit__(*exc_info)
        await self.apns.__aexit__(*exc_info)
        await self.service.__aexit__(*exc_info)

    async def prepare(self, db: DbConnection) -> None:
        return None

    def plan(self, jobs: int, rng: random.Random) -> list[Job]:
        originals = jobs - jobs // 10
        planned = []
        for n in range(originals):
            text = f"Order {n} is on its way"
            targets = []
            for k in range(rng.randint(1, 2)):
                made = self.service.subscribe(f"sub-{n}-{k}")
                script = _draw(rng)
                self._script(made.name, script)
                self.subscriptions[made.endpoint] = _Subscription(
                    name=made.name, endpoint=made.endpoint, text=text, script=script
                )
                targets.append(made.target)
            body = push_job_body(targets=targets, title="Shipped", body=text, allow_hosts=LOCAL)
            planned.append(effect_job(self.queue, n, f"web-{n}", body))
        self.jobs = originals
        return planned + duplicates_of(planned, jobs - originals, rng)

    def _script(self, name: str, script: str | None) -> None:
        if script == DEAD:
            self.service.unsubscribe(name)
        elif script == RATE_LIMITED:
            self.service.script(name, status=429, retry_after=1, times=1)
        elif script == UNAVAILABLE:
            self.service.script(name, status=503, times=1)

    def worker_env(self, workdir: Path) -> dict[str, str]:
        return fakes_env(self.apns, self.fcm, workdir, "CHAOS_", webpush=self.service)

    async def done(self, db: DbConnection) -> bool:
        return await settled(db, self.queue, self.jobs)

    def _taken(self) -> dict[str, list[WebPushRequest]]:
        """Each endpoint's requests the service took (the scripted 429 and 503 refused)."""
        found: dict[str, list[WebPushRequest]] = {}
        for request in self.service.requests:
            found.setdefault(request.endpoint, []).append(request)
        for endpoint, requests in found.items():
            if self.subscriptions[endpoint].script in (RATE_LIMITED, UNAVAILABLE):
                found[endpoint] = requests[1:]
        return found

    async def count(
        self, db: DbConnection, deaths: Sequence[Death], log_dir: Path
    ) -> ChannelFindings:
        rows = await ledger_rows(db, self.queue)
        endpoint_of = {str(r["effect_id"]): str(r["address"]) for r in rows}
        lost = {endpoint_of.get(e, e): n for e, n in answers_lost(log_dir).items()}
        status = {str(r["address"]): r["status"] for r in rows}
        taken = self._taken()
        arrivals = {e: [r.received_at for r in requests] for e, requests in taken.items()}
        live = {e for e, s in self.subscriptions.items() if s.script != DEAD}
        dead = set(self.subscriptions) - live
        return ChannelFindings(
            channel=self.name,
            tally=tally(live, arrivals, deaths, self._key, lost_answers=lost),
            figures={
                "subscriptions": len(self.subscriptions),
                "verified": len(self.service.requests),  # VAPID verified, payload decrypted
                "refused_by_script": sum(
                    1
                    for s in self.subscriptions.values()
                    if s.script in (RATE_LIMITED, UNAVAILABLE)
                ),
                "dead": len(dead),
            },
            zero={
                "refused": len(self.service.refusals),
                "other_text": sum(
                    1
                    for e, requests in taken.items()
                    for r in requests
                    if r.payload.get("body") != self.subscriptions[e].text
                ),
                "other_topic": sum(
                    1
                    for requests in taken.values()
                    for r in requests
                    if r.topic != requests[0].topic
                ),
                "unsettled": sum(
                    1 for e in self.subscriptions if status.get(e) not in ("sent", "failed")
                ),
                "live_failed": sum(1 for e in live if status.get(e) == "failed"),
                "dead_not_failed": sum(1 for e in dead if status.get(e) != "failed"),
            },
        )

    def _key(self, held: Held) -> str | None:
        return held.address if held.consumer == self.queue else None


def _draw(rng: random.Random) -> str | None:
    roll = rng.random()
    for script, share in _SHARES:
        if roll < share:
            return script
        roll -= share
    return None
