"""The push part of a chaos run: jobs, the fake providers' scripts, and the count.

Each push job has one or two devices (iOS through the fake APNs, Android
through the fake FCM), every token unique, and a tenth of the jobs are
published twice. Some tokens are scripted at the fakes: a dead token (410 /
UNREGISTERED, always), one 429 or one 5xx before success, one answer that
comes after the client's timeout, one dropped connection. The count reads
only the fakes' request logs and the ledger:

    pushes           requests the fakes took (answered 200, or would have,
                     had the client still been listening)
    extra_pushes     per device, taken requests beyond the first
    crashes_in_send  per device, taken requests whose answer no worker
                     recorded, other than scripted timeouts and drops: sends
                     cut by a worker's death (or a dropped connection)
    lost             a live device the fakes never took a request for

Every extra must carry the same collapse id as the device's first request.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType

from consumers import push_job_body
from dedupe import DbConnection
from providers import Platform, Target
from providers.fakes.apns import FakeApns
from providers.fakes.env import collapse_ids_sent, fakes_env
from providers.fakes.fcm import FakeFcm
from proving.chaos.app import PROVIDER_TIMEOUT_S, PUSH_QUEUE
from proving.chaos.workload import TENANTS, Job, JobKind, compact_json, duplicates_of


class Script(StrEnum):
    """How a fake answers a token (the first request; then 200, but for DEAD)."""

    DEAD = "provider_410"
    RATE_LIMITED = "provider_429"
    UNAVAILABLE = "provider_5xx"
    TIMEOUT = "provider_timeout"
    DROP = "provider_drop"


_SHARES = (
    (Script.DEAD, 0.02),
    (Script.RATE_LIMITED, 0.02),
    (Script.UNAVAILABLE, 0.02),
    (Script.TIMEOUT, 0.01),
    (Script.DROP, 0.01),
)
_LOST_ANSWER = (Script.TIMEOUT, Script.DROP)  # taken, but the client never heard


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    message_id: str
    target_index: int
    target: Target
    script: Script | None


def plan_pushes(total: int, rng: random.Random) -> tuple[list[Job], list[Device]]:
    """`total` push publishes (a tenth of them duplicates) and their devices."""
    originals = total - total // 10
    jobs: list[Job] = []
    devices: list[Device] = []
    for n in range(originals):
        message_id = f"push-{n}"
        targets = []
        for k in range(rng.randint(1, 2)):
            platform = rng.choice((Platform.IOS, Platform.ANDROID))
            target = Target(platform=platform, token=f"tok-{n:06d}-{k}-{rng.getrandbits(48):012x}")
            roll, script = rng.random(), None
            for kind, share in _SHARES:
                if roll < share:
                    script = kind
                    break
                roll -= share
            targets.append(target)
            devices.append(
                Device(message_id=message_id, target_index=k, target=target, script=script)
            )
        body = push_job_body(targets=targets, title="Shipped", body=f"Order {n} is on its way")
        jobs.append(
            Job(
                kind=JobKind.PUSH,
                queue=PUSH_QUEUE,
                message_id=message_id,
                tenant=TENANTS[n % len(TENANTS)],
                body=compact_json(body),
            )
        )
    jobs += duplicates_of(jobs, total - originals, rng)
    return jobs, devices


class FakeProviders:
    """The fake APNs and FCM servers, scripted for the plan's devices."""

    def __init__(self, devices: Sequence[Device], workdir: Path) -> None:
        self.devices = devices
        self.workdir = workdir
        self.apns = FakeApns()
        self.fcm = FakeFcm()

    async def __aenter__(self) -> FakeProviders:
        await self.apns.__aenter__()
        await self.fcm.__aenter__()
        for device in self.devices:
            if device.script is not None:
                self._script(device)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.fcm.__aexit__(kind, exc, tb)
        await self.apns.__aexit__(kind, exc, tb)

    def _script(self, device: Device) -> None:
        token, ios = device.target.token, device.target.platform is Platform.IOS
        late = PROVIDER_TIMEOUT_S + 1.0
        if device.script is Script.DEAD:
            if ios:
                self.apns.script(token, status=410)
            else:
                self.fcm.script(token, status=404)
        elif device.script is Script.RATE_LIMITED:
            if ios:
                self.apns.script(token, status=429, retry_after=1, times=1)
            else:
                self.fcm.script(token, status=429, retry_after=1, times=1)
        elif device.script is Script.UNAVAILABLE:
            if ios:
                self.apns.script(token, status=503, times=1)
            else:
                self.fcm.script(token, status=500, times=1)
        elif device.script is Script.TIMEOUT:
            if ios:
                self.apns.script(token, latency=late, times=1)
            else:
                self.fcm.script(token, latency=late, times=1)
        elif device.script is Script.DROP:
            if ios:
                self.apns.script(token, drop=True, times=1)
            else:
                self.fcm.script(token, drop=True, times=1)

    def drop_connections(self) -> None:
        """Cut every open HTTP/2 connection to the fake APNs, answers unsent."""
        self.apns.drop_connections()

    def worker_env(self) -> dict[str, str]:
        """What `proving.chaos.app.fake_providers` reads to reach the fakes."""
        return fakes_env(self.apns, self.fcm, self.workdir, "CHAOS_")

    def requests(self) -> dict[str, list[str]]:
        """Token -> the collapse id of every request the fakes read, in order."""
        found: dict[str, list[str]] = {}
        for token, collapse_id in collapse_ids_sent(self.apns, self.fcm):
            found.setdefault(token, []).append(collapse_id)
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class PushFindings:
    devices: int
    pushes: int
    extra_pushes: int
    crashes_in_send: int
    lost_answers: int  # scripted timeouts and drops the fakes served
    lost: int  # live devices never pushed
    dead_not_failed: int  # dead tokens whose ledger row is not `failed`
    collapse_mismatches: int  # extras with another collapse id than the first send
    unsettled: int  # ledger rows still claimed or sending
    scripts_served: Mapping[str, int]

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.dead_not_failed == 0
            and self.collapse_mismatches == 0
            and self.unsettled == 0
            and self.extra_pushes <= self.crashes_in_send + self.lost_answers
        )


async def ledger_status(db: DbConnection) -> dict[tuple[str, int], str]:
    rows = await db.fetch(
        "SELECT message_id, target_index, status FROM send_ledger WHERE consumer = $1",
        PUSH_QUEUE,
        timeout=30,
    )
    return {(r["message_id"], r["target_index"]): r["status"] for r in rows}


def check_pushes(
    devices: Sequence[Device],
    requests: Mapping[str, list[str]],
    status: Mapping[tuple[str, int], str],
) -> PushFindings:
    pushes = extra = crashes = lost_answers = lost = dead_bad = mismatches = unsettled = 0
    served: Counter[str] = Counter()
    for device in devices:
        seen = requests.get(device.target.token, [])
        row = status.get((device.message_id, device.target_index))
        if row in (None, "claimed", "sending"):
            unsettled += 1
        if device.script is Script.DEAD:
            served[str(Script.DEAD)] += min(len(seen), 1)
            dead_bad += row != "failed"
            continue
        taken = seen
        if device.script is not None and seen:
            served[str(device.script)] += 1
            if device.script not in _LOST_ANSWER:
                taken = seen[1:]  # the 429 or 5xx: refused, not pushed
        if not taken:
            lost += 1
            continue
        recorded = 1 if row == "sent" else 0
        scripted_loss = 1 if device.script in _LOST_ANSWER else 0
        pushes += len(taken)
        extra += len(taken) - 1
        lost_answers += scripted_loss
        crashes += max(len(taken) - recorded - scripted_loss, 0)
        mismatches += sum(1 for collapse in taken[1:] if collapse != taken[0])
    return PushFindings(
        devices=len(devices),
        pushes=pushes,
        extra_pushes=extra,
        crashes_in_send=crashes,
        lost_answers=lost_answers,
        lost=lost,
        dead_not_failed=dead_bad,
        collapse_mismatches=mismatches,
        unsettled=unsettled,
        scripts_served=dict(served),
    )
