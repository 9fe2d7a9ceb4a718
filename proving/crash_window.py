"""What arrived twice at a receiver, and whether a SIGKILL explains each extra arrival.

A channel that neither replays by key nor can be asked (webhooks, Web Push, SMTP,
APNs, FCM) may get a call twice after a crash: the killed worker's call reached
the receiver, its answer was never recorded, and once the lease expired another
worker sent it again with the same id. That window is counted the way
tests/test_webhook_takeover.py and tests/test_push_takeover.py count it:

1. right after a worker is SIGKILLed (by the run, or by itself at a crash
   point), read the ledger rows it held `sending` (`held_by`): their lease is
   still live, so nobody else can have called them since, and no worker will
   until it expires; each row's expiry is kept on this process' monotonic clock;
2. once the run is over, a held row is *on the wire at the kill* when its call
   reached the receiver before that expiry (after the expiry of an earlier kill
   that held it too, if any): the dead worker's call, answered or not;
3. `tally` then checks every intent: delivered at least once, and arrived no
   more often than once plus the kills that had it on the wire (plus answers the
   workers logged as lost, when a run allows those: `lost_answers`).

`key_of` names a row as the receiver knows it: a webhook by its webhook-id,
a device by its token, a subscription by its endpoint, an e-mail by its
Message-ID, an API call by its idempotency key.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dedupe import LEASE_EXPIRED, DbConnection
from providers import SendIds, webhook_id
from proving.deadlines import ANSWER_S


@dataclass(frozen=True, slots=True, kw_only=True)
class Held:
    """A ledger row a killed worker held `sending` when it died."""

    consumer: str
    channel: str
    address: str
    effect_id: str
    expires_at: float  # time.monotonic(): no other worker may call it before this


@dataclass(frozen=True, slots=True, kw_only=True)
class Death:
    """A worker killed mid-run, and the rows it held."""

    pid: int
    at: float  # time.monotonic()
    held: tuple[Held, ...]


async def held_by(db: DbConnection, pid: int) -> tuple[Held, ...]:
    """Step 1: the rows worker `pid` holds `sending` (its lease owner is host:pid:nonce)."""
    rows = await db.fetch(
        "SELECT consumer, channel, address, effect_id::text AS effect_id,"
        " extract(epoch FROM lease_expires_at - clock_timestamp())::float8 AS left_s"
        " FROM send_ledger WHERE status = 'sending' AND lease_owner LIKE $1",
        f"%:{pid}:%",
        timeout=ANSWER_S,
    )
    now = time.monotonic()
    return tuple(
        Held(
            consumer=r["consumer"],
            channel=r["channel"],
            address=r["address"],
            effect_id=r["effect_id"],
            expires_at=now + r["left_s"],
        )
        for r in rows
    )


async def died(db: DbConnection, pid: int) -> Death:
    """Read what worker `pid`, just killed, held (call it as soon as it is dead)."""
    at = time.monotonic()
    return Death(pid=pid, at=at, held=await held_by(db, pid))


@dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """One channel's count at its receiver (see the module docstring)."""

    intents: int  # calls that should arrive (ledger rows that were not a dead target)
    delivered: int  # of them, arrived at least once
    arrivals: int  # calls taken by the receiver, all told
    arrived_twice: int  # intents that arrived more than once
    duplicates: int  # arrivals beyond the first of each intent
    on_the_wire: int  # calls of killed workers that reached it, answer not recorded
    lost_answers: int  # answers the workers logged as lost (a timeout), allowed a resend
    beyond_window: int  # duplicates neither a kill nor a lost answer explains
    sample: tuple[str, ...] = ()  # keys lost or doubled beyond the window, a few

    @property
    def lost(self) -> int:
        return self.intents - self.delivered

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.beyond_window == 0

    def fields(self) -> str:
        return (
            f"intents={self.intents} delivered={self.delivered} lost={self.lost}"
            f" arrived_twice={self.arrived_twice} duplicates={self.duplicates}"
            f" on_the_wire_at_kills={self.on_the_wire} lost_answers={self.lost_answers}"
            f" beyond_window={self.beyond_window}"
        )


def on_the_wire(
    deaths: Sequence[Death],
    arrivals: Mapping[str, Sequence[float]],
    key_of: Callable[[Held], str | None],
) -> Counter[str]:
    """Step 2: per key, the kills that had its call on the wire."""
    window: Counter[str] = Counter()
    since: dict[str, float] = {}  # the expiry of the last kill that held the key
    for death in sorted(deaths, key=lambda d: d.at):
        for held in death.held:
            key = key_of(held)
            if key is None:
                continue
            after = since.get(key, float("-inf"))
            if any(after < t < held.expires_at for t in arrivals.get(key, ())):
                window[key] += 1
            since[key] = held.expires_at
    return window


def tally(
    intents: Collection[str],
    arrivals: Mapping[str, Sequence[float]],
    deaths: Sequence[Death],
    key_of: Callable[[Held], str | None],
    *,
    lost_answers: Mapping[str, int] | None = None,
) -> Tally:
    """Step 3, over `intents` (keys): `arrivals` are the times each key was taken."""
    window = on_the_wire(deaths, arrivals, key_of)
    lost_answers = lost_answers or {}
    delivered = twice = duplicates = beyond = 0
    sample: list[str] = []
    for key in intents:
        taken = len(arrivals.get(key, ()))
        delivered += taken > 0
        extra = max(0, taken - 1)
        twice += extra > 0
        duplicates += extra
        unexplained = max(0, extra - window[key] - lost_answers.get(key, 0))
        beyond += unexplained
        if (taken == 0 or unexplained) and len(sample) < 5:
            sample.append(key)
    return Tally(
        intents=len(intents),
        delivered=delivered,
        arrivals=sum(len(arrivals.get(key, ())) for key in intents),
        arrived_twice=twice,
        duplicates=duplicates,
        on_the_wire=sum(window[key] for key in intents),
        lost_answers=sum(lost_answers.get(key, 0) for key in intents),
        beyond_window=beyond,
        sample=tuple(sample),
    )


def answers_lost(log_dir: Path) -> Counter[str]:
    """effect_id -> sends the workers logged with an unknown outcome (a timeout, a lost
    connection: `<kind>_deferred`, reason `unknown_outcome: ...`), each of which may have
    arrived and is sent again; a send re-leased after a dead worker's lease is not one."""
    lost: Counter[str] = Counter()
    for path in sorted(log_dir.glob("worker-*.log")):
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if '_deferred"' not in line:
                    continue
                with contextlib.suppress(ValueError, AttributeError):  # a line cut by a kill
                    fields = json.loads(line)
                    reason = str(fields.get("reason", ""))
                    if reason != LEASE_EXPIRED and reason.startswith("unknown_outcome"):
                        lost[str(fields.get("effect_id"))] += 1
    return lost


def webhook_id_of(effect_id: str) -> str:
    """The webhook-id the calls of a ledger row carry, derived as the sender derives it."""
    ids = SendIds(effect_id=effect_id, collapse_id="", fcm_collapse_key="", webpush_topic="")
    return webhook_id(ids)


def webhook_key(held: Held) -> str:
    """A webhook row as its receiver knows it: its webhook-id."""
    return webhook_id_of(held.effect_id)


def address_key(held: Held) -> str:
    """A row as a receiver that knows its address knows it: a device token, an endpoint."""
    return held.address
