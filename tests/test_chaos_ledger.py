"""The send ledger's state machine under hypothesis: claim, send, crash, expire, redeliver.

Two workers hold copies of one push job (one target). Hypothesis interleaves
deliveries (a first claim or a redelivery), concurrent duplicate deliveries,
provider sends, records, transient failures, timeouts (the provider took it
but the answer was lost), crashes at any point of the bracket, and lease
expiry of a crashed worker's lease, against the real `SendLedger` and
`Inbox` in PostgreSQL. After every step:

- the job's local effect (written with its claim) happened at most once;
- the provider accepted it at most 1 + (crashes after the provider accepted,
  before the answer was recorded) + (timeouts) times: a duplicate needs a
  crash or a lost answer, never a race;
- once `sent` is recorded, no worker ever gets the lease again.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from enum import StrEnum
from typing import Any, TypeVar

import asyncpg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dedupe import (
    Claim,
    ClaimOutcome,
    DedupeKey,
    Inbox,
    SendIntent,
    SendLedger,
    SendResult,
    SendStatus,
    TargetKey,
    UnknownOutcome,
    migrate,
    quote_ident,
)
from tests.conftest import DATABASE_URL

T = TypeVar("T")
KEY = DedupeKey(consumer="chaos.push", tenant="acme", message_id="push-1")
TARGET = TargetKey(key=KEY, target_index=0)
WORKERS = ("worker-a", "worker-b")
LEASE_S = 30.0


class Phase(StrEnum):
    IDLE = "idle"  # holds nothing (or crashed: its lease, if any, is orphaned)
    LEASED = "leased"  # holds the lease, has not called the provider yet
    SENT = "sent"  # the provider accepted; the answer is not recorded yet


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.schema = f"t_{uuid.uuid4().hex[:16]}"
        self.admin: asyncpg.Connection = self._run(self._setup())
        self.conns: dict[str, asyncpg.Connection] = {
            w: self._run(asyncpg.connect(DATABASE_URL)) for w in WORKERS
        }
        self.inbox = Inbox(self.schema)
        self.ledgers = {w: SendLedger(self.schema, w) for w in WORKERS}
        self.phase = dict.fromkeys(WORKERS, Phase.IDLE)
        self.accepted = 0  # provider accepts
        self.crashes_in_send = 0
        self.lost_answers = 0  # timeouts after the provider accepted

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def _setup(self) -> asyncpg.Connection:
        admin = await asyncpg.connect(DATABASE_URL)
        await migrate(admin, self.schema)
        await admin.execute(
            f"CREATE TABLE {quote_ident(self.schema)}.effects (message_id text NOT NULL)"
        )
        return admin

    def teardown(self) -> None:
        async def close() -> None:
            for conn in self.conns.values():
                await conn.close()
            await self.admin.execute(f"DROP SCHEMA {quote_ident(self.schema)} CASCADE")
            await self.admin.close()

        self._run(close())
        self.loop.close()

    # -- what a worker does (EffectsRunner's three steps, one target) ------------

    async def _deliver(self, worker: str) -> Phase:
        """Step 1: claim + intent (a new job), or lease what may be sent (a repeat)."""
        conn = self.conns[worker]
        ledger = self.ledgers[worker]
        async with conn.transaction():
            (outcome,) = await self.inbox.claim(conn, [Claim(key=KEY, fingerprint=b"f")])
            if outcome is ClaimOutcome.NEW:
                await conn.execute(
                    f"INSERT INTO {quote_ident(self.schema)}.effects VALUES ($1)", KEY.message_id
                )
                intent = SendIntent(
                    target=TARGET,
                    channel="ios",
                    address="tok",
                    effect_id=str(uuid.uuid5(uuid.NAMESPACE_URL, "push-1")),
                    collapse_id="c-1",
                )
                await ledger.open(conn, [intent], LEASE_S)
                return Phase.LEASED
            rows = await ledger.take(conn, [KEY], LEASE_S, UnknownOutcome.RESEND)
        return Phase.LEASED if any(r.mine for r in rows) else Phase.IDLE

    def _idle(self) -> list[str]:
        return [w for w in WORKERS if self.phase[w] is Phase.IDLE]

    def _in(self, phase: Phase) -> list[str]:
        return [w for w in WORKERS if self.phase[w] is phase]

    # -- rules ------------------------------------------------------------------

    @precondition(lambda self: bool(self._idle()))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(self._idle()))
        self.phase[worker] = self._run(self._deliver(worker))

    @precondition(lambda self: len(self._idle()) == len(WORKERS))
    @rule()
    def deliver_concurrently(self) -> None:
        """Both workers hold a copy of the job at the same moment."""

        async def both() -> list[Phase]:
            return list(await asyncio.gather(*(self._deliver(w) for w in WORKERS)))

        for worker, phase in zip(WORKERS, self._run(both()), strict=True):
            self.phase[worker] = phase

    @precondition(lambda self: bool(self._idle()))
    @rule(data=st.data())
    def crash_before_commit(self, data: st.DataObject) -> None:
        """Step 1 ran, then the process died before COMMIT: nothing of it stays."""
        worker = data.draw(st.sampled_from(self._idle()))

        async def doomed() -> None:
            conn = self.conns[worker]
            tx = conn.transaction()
            await tx.start()
            try:
                await self.inbox.claim(conn, [Claim(key=KEY, fingerprint=b"f")])
            finally:
                await tx.rollback()

        self._run(doomed())

    @precondition(lambda self: bool(self._in(Phase.LEASED)))
    @rule(data=st.data())
    def provider_accepts(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(self._in(Phase.LEASED)))
        self.accepted += 1
        self.phase[worker] = Phase.SENT

    @precondition(lambda self: bool(self._in(Phase.SENT)))
    @rule(data=st.data())
    def record_sent(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(self._in(Phase.SENT)))
        result = SendResult(target=TARGET, status=SendStatus.SENT, provider_message_id="p-1")
        self._record(worker, result)

    @precondition(lambda self: bool(self._in(Phase.LEASED)))
    @rule(data=st.data(), accepted=st.booleans())
    def provider_fails_transiently(self, data: st.DataObject, accepted: bool) -> None:
        """429/5xx (not sent), or a timeout (maybe sent): released to `claimed`."""
        worker = data.draw(st.sampled_from(self._in(Phase.LEASED)))
        if accepted:  # a timeout after the provider took it: the answer is lost
            self.accepted += 1
            self.lost_answers += 1
        result = SendResult(target=TARGET, status=SendStatus.CLAIMED, failure_reason="timeout")
        self._record(worker, result)

    def _record(self, worker: str, result: SendResult) -> None:
        async def record() -> None:
            conn = self.conns[worker]
            async with conn.transaction():
                await self.ledgers[worker].record(conn, [result])

        self._run(record())
        self.phase[worker] = Phase.IDLE

    @precondition(lambda self: bool(self._in(Phase.LEASED) + self._in(Phase.SENT)))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """SIGKILL: the lease stays behind in the ledger, orphaned."""
        worker = data.draw(st.sampled_from(self._in(Phase.LEASED) + self._in(Phase.SENT)))
        if self.phase[worker] is Phase.SENT:
            self.crashes_in_send += 1
        self.phase[worker] = Phase.IDLE

    @precondition(lambda self: len(self._idle()) == len(WORKERS))
    @rule()
    def lease_expires(self) -> None:
        """Time passes beyond the lease of a worker that is no longer there."""
        self._run(
            self.admin.execute(
                f"UPDATE {quote_ident(self.schema)}.send_ledger"
                " SET lease_expires_at = now() - interval '1 second' WHERE status = 'sending'"
            )
        )

    # -- invariants -------------------------------------------------------------

    @invariant()
    def local_effect_at_most_once(self) -> None:
        effects = self._run(
            self.admin.fetchval(f"SELECT count(*) FROM {quote_ident(self.schema)}.effects")
        )
        assert effects <= 1

    @invariant()
    def sends_bounded_by_crashes_in_send(self) -> None:
        assert self.accepted <= 1 + self.crashes_in_send + self.lost_answers

    @invariant()
    def no_lease_after_sent(self) -> None:
        status = self._run(
            self.admin.fetchval(f"SELECT status FROM {quote_ident(self.schema)}.send_ledger")
        )
        if status == SendStatus.SENT:
            assert not self._in(Phase.LEASED) and not self._in(Phase.SENT)


LedgerMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_send_ledger_sends_at_most_once_plus_crashes_in_send = LedgerMachine.TestCase
