"""The demo's push part: jobs for the fake APNs, FCM and Web Push, and a report read from them.

Targets are iOS devices (the fake APNs), Android devices and FCM web tokens
(the fake FCM) and Web Push subscriptions (the fake push service, which checks
every request's VAPID JWT and decrypts its payload, as a browser vendor's does).
Every count comes from the ledger (`send_ledger`), the `demo_pruned` table the
`on_invalid_token` hook writes, and the requests the fakes read.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from consumers import push_job_body
from dedupe import DbConnection
from providers import Platform, Target
from providers.fakes.apns import ApnsReply, FakeApns
from providers.fakes.env import collapse_ids_sent, fakes_env
from providers.fakes.fcm import FakeFcm, FcmReply
from providers.fakes.webpush import FakeWebPush, WebPushReply
from proving.crash_window import Death, Held, Tally, tally
from proving.deadlines import ANSWER_S
from proving.demo.app import PUSH_QUEUE

LATENCY_S = 0.05  # every fake answers after this: calls are on the wire at the SIGKILL
LOCAL = frozenset({"127.0.0.1"})  # the fake push service's host, allowed for the demo
# Where each channel's requests go, as the report names them.
SERVICES = {"ios": "apns", "android": "fcm", "web": "fcm", "webpush": "webpush"}


@dataclass(frozen=True, slots=True, kw_only=True)
class PushPlan:
    jobs: list[tuple[str, bytes]]  # (message_id, body), duplicates included
    targets: int  # distinct (job, target) pairs: the pushes that should go out once
    dead_tokens: frozenset[str]  # the fakes answer 410 / UNREGISTERED for these
    dead_subscriptions: frozenset[str]  # names of subscriptions the browser dropped (410)
    subscriptions: int  # of the targets, Web Push subscriptions


class DemoFakes:
    """The fake APNs, FCM and Web Push services; `script` sets the plan's dead targets."""

    def __init__(self) -> None:
        self.apns = FakeApns(unscripted=ApnsReply(latency=LATENCY_S))
        self.fcm = FakeFcm()
        self.fcm.unscripted = FcmReply(latency=LATENCY_S)
        self.webpush = FakeWebPush(unscripted=WebPushReply(latency=LATENCY_S))
        self._dir = tempfile.TemporaryDirectory(prefix="iw-demo-keys-")

    async def __aenter__(self) -> DemoFakes:
        await self.apns.__aenter__()
        await self.fcm.__aenter__()
        await self.webpush.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.webpush.__aexit__(kind, exc, tb)
        await self.fcm.__aexit__(kind, exc, tb)
        await self.apns.__aexit__(kind, exc, tb)
        self._dir.cleanup()

    def script(self, plan: PushPlan) -> None:
        for token in plan.dead_tokens:
            self.apns.script(token, status=410)
            self.fcm.script(token, status=404)
        for name in plan.dead_subscriptions:
            self.webpush.unsubscribe(name)  # 410 Gone from now on

    def worker_env(self) -> dict[str, str]:
        """What `proving.demo.app.fake_providers` reads to reach the fakes."""
        return fakes_env(self.apns, self.fcm, Path(self._dir.name), "DEMO_", webpush=self.webpush)

    def requests(self) -> list[tuple[str, str]]:
        """(token or endpoint, collapse id or Topic) of every request the fakes read."""
        return collapse_ids_sent(self.apns, self.fcm, self.webpush)

    def arrivals(self) -> dict[str, dict[str, list[float]]]:
        """Per service, when each token or endpoint's requests were read."""
        found: dict[str, dict[str, list[float]]] = {"apns": {}, "fcm": {}, "webpush": {}}
        for r in self.apns.requests:
            found["apns"].setdefault(r.token, []).append(r.received_at)
        for f in self.fcm.requests:
            found["fcm"].setdefault(f.token, []).append(f.received_at)
        for w in self.webpush.requests:  # every one passed the VAPID check and decrypted
            found["webpush"].setdefault(w.endpoint, []).append(w.received_at)
        return found


def plan_pushes(total: int, rng: random.Random, webpush: FakeWebPush) -> PushPlan:
    """`total` push jobs of 1 to 3 targets each (iOS, Android, an FCM web token or a Web
    Push subscription); 2% of the targets dead; 10% of the jobs published twice."""
    jobs: list[tuple[str, bytes]] = []
    targets = subscriptions = 0
    dead: set[str] = set()
    dropped: set[str] = set()
    for n in range(total):
        devices = []
        for k in range(rng.randint(1, 3)):
            kind = rng.choice(("ios", "android", "web", "webpush"))
            gone = rng.random() < 0.02
            if kind == "webpush":
                name = f"browser-{n:05d}-{k}"
                target = webpush.subscribe(name).target
                subscriptions += 1
                if gone:
                    dropped.add(name)
            else:
                token = f"device-{n:05d}-{k}-{rng.getrandbits(64):016x}"
                target = Target(platform=Platform(kind), token=token)
                if gone:
                    dead.add(token)
            devices.append(target)
        targets += len(devices)
        body = push_job_body(
            targets=devices,
            title="Your order shipped",
            body=f"Order {n} is on its way",
            data={"order": str(n)},
            allow_hosts=LOCAL,
        )
        jobs.append((f"order-{n}-shipped-push", json.dumps(body).encode()))
    jobs += rng.sample(jobs, total // 10)
    rng.shuffle(jobs)
    return PushPlan(
        jobs=jobs,
        targets=targets,
        dead_tokens=frozenset(dead),
        dead_subscriptions=frozenset(dropped),
        subscriptions=subscriptions,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PushReport:
    expected: int
    sent: int
    failed: int
    provider_ids_recorded: int
    extra_pushes: int  # requests beyond one per device, at the fakes
    # Requests for a device beyond the leases its ledger row was given (`sends`):
    # a provider client resending on its own, or two workers sending under one lease.
    extra_beyond_leases: int
    extra_with_other_collapse_id: int
    pruned: int
    not_settled: int
    tallies: dict[str, Tally]  # per service (apns, fcm, webpush): at the receiver
    verified: int  # Web Push requests whose VAPID JWT verified and payload decrypted
    refused: int  # Web Push requests the fake refused (a bad JWT, a payload that did not decrypt)

    @property
    def ok(self) -> bool:
        return (
            self.not_settled == 0
            and self.extra_with_other_collapse_id == 0
            and self.extra_beyond_leases == 0
            and self.refused == 0
            and all(t.ok for t in self.tallies.values())
        )

    def lines(self) -> list[str]:
        lines = [f"push.{name}: {t.fields()}" for name, t in self.tallies.items()]
        lines.append(f"webpush: verified={self.verified} refused={self.refused}")
        return lines


async def settled_targets(db: DbConnection, consumer: str) -> int:
    done: int = await db.fetchval(
        "SELECT count(*) FROM send_ledger WHERE consumer = $1 AND status IN ('sent', 'failed')",
        consumer,
        timeout=ANSWER_S,
    )
    return done


async def push_report(
    db: DbConnection,
    fakes: DemoFakes,
    plan: PushPlan,
    deaths: Sequence[Death],
    lost_answers: Mapping[str, int],
) -> PushReport:
    """`lost_answers`: effect_id -> sends the workers logged with an unknown outcome."""
    rows = await db.fetch(
        "SELECT channel, status, provider_message_id, address, sends,"
        " effect_id::text AS effect_id FROM send_ledger"
        " WHERE consumer = $1",
        PUSH_QUEUE,
        timeout=ANSWER_S,
    )
    by_status = Counter(r["status"] for r in rows)
    leases = Counter[str]()
    for r in rows:
        leases[r["address"]] += r["sends"]
    requests = fakes.requests()
    per_token = Counter(token for token, _ in requests)
    collapse_ids: dict[str, set[str]] = {}
    for token, collapse in requests:
        collapse_ids.setdefault(token, set()).add(collapse)
    arrivals = fakes.arrivals()
    address_of = {r["effect_id"]: r["address"] for r in rows}
    lost = {address_of[e]: n for e, n in lost_answers.items() if e in address_of}
    tallies = {}
    for service, found in arrivals.items():
        intents = {  # a dead target's row failed: it is not a push that should arrive
            r["address"]
            for r in rows
            if SERVICES[r["channel"]] == service and r["status"] == "sent"
        }
        tallies[service] = tally(intents, found, deaths, _push_key, lost_answers=lost)
    return PushReport(
        expected=plan.targets,
        sent=by_status["sent"],
        failed=by_status["failed"],
        provider_ids_recorded=sum(1 for r in rows if r["provider_message_id"]),
        extra_pushes=sum(n - 1 for n in per_token.values() if n > 1),
        extra_beyond_leases=sum(max(0, n - leases[token]) for token, n in per_token.items()),
        extra_with_other_collapse_id=sum(1 for ids in collapse_ids.values() if len(ids) > 1),
        pruned=await db.fetchval("SELECT count(*) FROM demo_pruned", timeout=ANSWER_S),
        not_settled=plan.targets - by_status["sent"] - by_status["failed"],
        tallies=tallies,
        verified=len(fakes.webpush.requests),
        refused=len(fakes.webpush.refusals),
    )


def _push_key(held: Held) -> str | None:
    return held.address if held.consumer == PUSH_QUEUE else None
