"""The demo's push part: jobs for the fake APNs and FCM, and a report read from them.

Every count comes from the ledger (`send_ledger`), the `demo_pruned`
table the `on_invalid_token` hook writes, and the requests the fakes read.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from consumers import push_job_body
from dedupe import DbConnection
from providers import Platform, Target
from providers.fakes.apns import FakeApns
from providers.fakes.env import collapse_ids_sent, fakes_env
from providers.fakes.fcm import FakeFcm
from proving.deadlines import ANSWER_S


@dataclass(frozen=True, slots=True, kw_only=True)
class PushPlan:
    jobs: list[tuple[str, bytes]]  # (message_id, body), duplicates included
    targets: int  # distinct (job, target) pairs: the pushes that should go out once
    dead_tokens: frozenset[str]  # the fakes answer 410 / UNREGISTERED for these


def plan_pushes(total: int, rng: random.Random) -> PushPlan:
    """`total` push jobs of 1 to 3 devices each; 2% dead tokens; 10% published twice."""
    platforms = [Platform.IOS, Platform.ANDROID, Platform.WEB]
    jobs: list[tuple[str, bytes]] = []
    targets = 0
    dead: set[str] = set()
    for n in range(total):
        devices = []
        for k in range(rng.randint(1, 3)):
            token = f"device-{n:05d}-{k}-{rng.getrandbits(64):016x}"
            if rng.random() < 0.02:
                dead.add(token)
            devices.append(Target(platform=rng.choice(platforms), token=token))
        targets += len(devices)
        body = push_job_body(
            targets=devices,
            title="Your order shipped",
            body=f"Order {n} is on its way",
            data={"order": str(n)},
        )
        jobs.append((f"order-{n}-shipped-push", json.dumps(body).encode()))
    jobs += rng.sample(jobs, total // 10)
    rng.shuffle(jobs)
    return PushPlan(jobs=jobs, targets=targets, dead_tokens=frozenset(dead))


class DemoFakes:
    """The fake APNs and FCM servers, scripted for the plan's dead tokens."""

    def __init__(self, plan: PushPlan) -> None:
        self.plan = plan
        self.apns = FakeApns()
        self.fcm = FakeFcm()
        self._dir = tempfile.TemporaryDirectory(prefix="iw-demo-keys-")

    async def __aenter__(self) -> DemoFakes:
        await self.apns.__aenter__()
        await self.fcm.__aenter__()
        for token in self.plan.dead_tokens:
            self.apns.script(token, status=410)
            self.fcm.script(token, status=404)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.fcm.__aexit__(kind, exc, tb)
        await self.apns.__aexit__(kind, exc, tb)
        self._dir.cleanup()

    def worker_env(self) -> dict[str, str]:
        """What `proving.demo.app.fake_providers` reads to reach the fakes."""
        return fakes_env(self.apns, self.fcm, Path(self._dir.name), "DEMO_")

    def requests(self) -> list[tuple[str, str]]:
        """(token, collapse id) of every request either fake read."""
        return collapse_ids_sent(self.apns, self.fcm)


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

    @property
    def ok(self) -> bool:
        return (
            self.not_settled == 0
            and self.extra_with_other_collapse_id == 0
            and self.extra_beyond_leases == 0
        )


async def settled_targets(db: DbConnection) -> int:
    done: int = await db.fetchval(
        "SELECT count(*) FROM send_ledger WHERE status IN ('sent', 'failed')",
        timeout=ANSWER_S,
    )
    return done


async def push_report(db: DbConnection, fakes: DemoFakes, plan: PushPlan) -> PushReport:
    rows = await db.fetch(
        "SELECT status, provider_message_id, address, sends FROM send_ledger", timeout=ANSWER_S
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
    )
