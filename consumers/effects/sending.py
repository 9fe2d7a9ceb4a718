"""Steps 2 and 3 of an effects batch: send its jobs' targets chunk by chunk, record the answers.

One loop per batch does the database writes of the batch after its claim,
one at a time (`_writes`), so what it believes it holds is what the ledger says:

- it records the answers as they come (one transaction for every answer that
  arrived within RECORD_WINDOW_SECONDS of the first one not yet recorded, or
  while the previous transaction ran): a crash then re-sends only what was in
  flight or not yet recorded;
- a task of its own renews the batch's lease when due (`consumers.effects.lease`),
  for every job with rows leased and unrecorded, between two of those writes;
- when fewer than half a chunk of a job is leased and unanswered, it leases the
  next CHUNK_TARGETS of its targets, at the expiry the others hold: what is
  leased and not started stays about one chunk per job, whatever its size;
- a job whose leased targets are all answered and recorded, with none left to
  lease (or the lease lost), is settled then, on its own.

Sends run with no transaction open, at most `max_in_flight` per provider (the
rest wait here, so the deadline a send is given is read when it can start),
each only while its lease leaves the provider's `answer_seconds`; a send that
met a lease too short waits for its renewal, and none starts once it is lost.

A target called before (its row leased again: the earlier call failed, or its
sender died mid-call) is sent as its channel allows (`providers.Recovery`):

- replays by key: called again with the same key only while the call can reach
  the provider inside its window (counted from the row's first lease, so never
  later than the provider counts it); past it, never: the row fails as
  `unknown_outcome: replay_window_passed`, for an operator to look at;
- lookup by key: the provider is asked first (`LooksUp.look_up`); a call it has
  is recorded as sent with its id, and only one it never had is made;
- neither: sent again with the same ids (the queue's RESEND; SKIP never gets here).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg

from consumers.effects.answers import (
    Answered,
    Send,
    answered,
    never_sent,
    paused,
    probe_result,
    sender_for,
)
from consumers.effects.circuit import Circuits
from consumers.effects.gate import ProviderGate
from consumers.effects.lease import Lease
from consumers.effects.quota import FleetQuotas
from consumers.effects.traced import close_send, send_span
from consumers.handlers.spec import EffectSpec
from consumers.message.verdict import Verdict, error_text
from consumers.pipeline.deliveries import Item
from consumers.telemetry.tracing import Span
from dedupe import DedupeKey, SendRow, SendStatus
from providers import (
    JobIds,
    LooksUp,
    NotStartedInTime,
    ProviderConfigurationError,
    ProviderError,
    ProviderReceipt,
    RecoveryKind,
    Sender,
    TransientProviderError,
    UnknownOutcomeError,
)

CHUNK_TARGETS = 100  # targets of one job leased at once
RECORD_WINDOW_SECONDS = 0.05  # how long answers gather before a recording transaction


class FanoutSteps(Protocol):
    """What the runner does for a fanout: the database steps and a job's verdict."""

    async def record(self, answers: list[Answered], batch: Span | None = None) -> bool:
        """Step 3 for `answers`, in one transaction; False: not recorded (database lost).
        `batch`: the batch's span, when traced."""

    async def take_chunks(self, items: list[Item], lease: Lease) -> list[SendRow] | None:
        """Lease the next chunk of these jobs at `lease`; every row; None: database lost."""

    def new_send(self, progress: JobProgress, row: SendRow, started: float) -> Send:
        """The send of a row leased to the job `progress` follows, by a statement begun
        after `started` (`time.monotonic()`)."""

    def verdict(self, progress: JobProgress) -> Verdict:
        """The verdict of a job whose leased targets are all answered (or lost)."""

    async def settle(self, decided: Sequence[tuple[Item, Verdict]]) -> None: ...


@dataclass(slots=True, kw_only=True)
class JobProgress:
    """One job of the batch: what is leased and unrecorded, what is left to lease."""

    item: Item
    job: Any
    takeable: int  # rows we may still lease, as far as the claim or the last chunk showed
    held: int = 0  # rows leased to us whose answer is not recorded yet
    answers: list[Answered] = field(default_factory=list)
    unrecorded: bool = False
    waits: Verdict | None = None  # its verdict if other targets wait on another worker's lease
    ids: JobIds  # the ids its pushes share (`providers.job_ids`)


def asks_pause(reply: object) -> bool:
    """The provider asked for no calls for a while (a 429's or a 503's Retry-After)."""
    return (
        isinstance(reply, TransientProviderError)
        and not isinstance(reply, NotStartedInTime | ProviderConfigurationError)
        and bool(reply.retry_after)
    )


def takeable(rows: Sequence[SendRow]) -> int:
    """Rows a chunk could still lease: `claimed`, or `sending` under a lapsed lease."""
    return sum(
        r.status is SendStatus.CLAIMED
        or (r.status is SendStatus.SENDING and not r.mine and r.lease_seconds_left == 0)
        for r in rows
    )


class Fanout:
    """One batch's sends, records, renewals and chunks (see the module docstring)."""

    def __init__(
        self,
        *,
        effects: EffectSpec,
        pool: asyncpg.Pool,
        provider: Sender[Any],
        circuits: Circuits,
        gate: ProviderGate,
        lease: Lease,
        steps: FanoutSteps,
        batch: Span | None = None,
        quotas: FleetQuotas | None = None,
    ) -> None:
        self.effects = effects
        self.quotas = quotas  # the fleet's provider quotas, when any is set
        self.pool = pool
        self.provider = provider
        self.circuits = circuits
        self.gate = gate
        self.lease = lease
        self.steps = steps
        self.batch = batch  # its span, when traced
        self._arrived: list[Answered] = []
        self._new_answer = asyncio.Event()
        self._everything = asyncio.Event()
        self._outstanding = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._writes = asyncio.Lock()  # the batch's ledger writes, one at a time
        # The batch was cancelled (a stop past its grace): sends not started by
        # now start no more, so the wait for those in flight ends.
        self._stopping = False

    async def run(
        self,
        jobs: list[JobProgress],
        sends: list[Send],
        settled: set[Item],
        started: Callable[[], None],
    ) -> None:
        """Send, record and settle `jobs`; `started()` once the first answers are recorded."""
        progress = {p.item: p for p in jobs}

        def held() -> dict[DedupeKey, int]:
            return {
                p.item.envelope.key: p.held
                for p in progress.values()
                if p.held and p.item.envelope is not None
            }

        keeping = asyncio.create_task(self.lease.keep(self.pool, self._writes, held))
        try:
            self._start(progress, sends)
            while progress:
                await self._wait()
                group, self._arrived = self._arrived, []
                async with self._writes:  # what held() says stays what the ledger holds
                    recorded = await self.steps.record(group, self.batch) if group else True
                    for answer in group:
                        p = progress[answer.send.item]
                        p.held -= 1
                        p.answers.append(answer)
                        p.unrecorded = p.unrecorded or not recorded
                    await self._refill(progress)
                started()  # the loop may take the next batch (consumers.pipeline.loop)
                # Nothing leased and unrecorded: its chunks are done, or none is left to lease.
                done = [p for p in progress.values() if p.held == 0]
                for p in done:
                    del progress[p.item]
                verdicts = [(p.item, self.steps.verdict(p)) for p in done]
                await self.steps.settle(verdicts)
                settled.update(p.item for p in done)
        except asyncio.CancelledError:
            self._stopping = True
            raise
        finally:
            # Never cancel a send on the wire; an error above waits for them.
            await asyncio.gather(*self._tasks, return_exceptions=True)
            keeping.cancel()
            await asyncio.gather(keeping, return_exceptions=True)

    def _more(self, p: JobProgress) -> bool:
        """Targets left to lease that this batch may still lease."""
        return p.takeable > 0 and not self.lease.lost and not p.unrecorded

    async def _wait(self) -> None:
        """Until an answer came (and the others of its moment)."""
        await self._new_answer.wait()
        if self._arrived:
            # Answers of one batch come close together: give the rest a
            # moment, so a batch usually takes one recording transaction
            # and a slow straggler does not hold the others' records back.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._everything.wait(), RECORD_WINDOW_SECONDS)
        self._new_answer.clear()

    async def _refill(self, progress: dict[Item, JobProgress]) -> None:
        """Lease the next chunk of every job with less than half a chunk unanswered."""
        wanting = [
            p.item for p in progress.values() if self._more(p) and p.held < CHUNK_TARGETS // 2
        ]
        if not wanting:
            return
        started = time.monotonic()
        rows = await self.steps.take_chunks(wanting, self.lease)
        if rows is None:  # the database is lost: take nothing more
            for item in wanting:
                progress[item].takeable = 0
            return
        by_job: dict[DedupeKey, list[SendRow]] = {}
        for row in rows:
            by_job.setdefault(row.target.key, []).append(row)
        sends: list[Send] = []
        for item in wanting:
            assert item.envelope is not None
            p = progress[item]
            of_job = by_job.get(item.envelope.key, [])
            p.takeable = takeable(of_job)
            sends += [self.steps.new_send(p, r, started) for r in of_job if r.mine]
        self._start(progress, sends)

    def _start(self, progress: dict[Item, JobProgress], sends: list[Send]) -> None:
        for send in sends:
            progress[send.item].held += 1
            self._outstanding += 1
            self._everything.clear()
            task = asyncio.create_task(self._send(send))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, send: Send) -> None:
        cancelled: asyncio.CancelledError | None = None
        target = sender_for(self.provider, send.recipient.channel)
        span = send_span(send) if send.item.span is not None else None
        try:
            async with self.gate.slot(target, send.target.key.tenant):
                answer = await self._attempt(send, target)
        except asyncio.CancelledError as exc:  # counted below, then re-raised
            cancelled = exc
            answer = answered(send, UnknownOutcomeError("Cancelled"), self.effects.unknown_outcome)
        if span is not None:
            close_send(span, answer)
        self._arrived.append(answer)
        self._new_answer.set()
        self._outstanding -= 1
        if self._outstanding == 0:
            self._everything.set()
        if cancelled is not None:
            raise cancelled

    async def _attempt(self, send: Send, target: Sender[Any]) -> Answered:
        """One send, once its lease leaves `target` the time to answer; none once lost.

        A target called before goes as its channel allows (the module docstring).
        Under a fleet quota each call takes a token first, and a Retry-After pauses
        the quota for the fleet (`consumers.effects.quota`)."""
        policy, lease = self.effects.unknown_outcome, self.lease
        circuit = self.circuits.of(send.provider)
        recovery = target.recovery.kind
        ask_first = send.previous > 0 and recovery is RecoveryKind.LOOKUP_BY_KEY
        bucket = self.quotas.of(target) if self.quotas is not None else None
        token = bucket is None  # a token is used at once or dropped: taken right before a call
        effect: object = None
        while True:
            answer_by = lease.answer_by()
            if lease.lost or self._stopping:
                reason = "LeaseLost" if lease.lost else "Stopping"
                return answered(send, NotStartedInTime(reason, provider=target.name), policy)
            now = time.monotonic()
            if now > answer_by - target.answer_seconds:
                token = bucket is None
                await self._renewal()  # the lease is due a renewal: wait for it
                continue
            if not circuit.admit():
                return paused(send, circuit.reason or "", circuit.seconds_to_probe())
            if (
                send.previous > 0
                and recovery is RecoveryKind.REPLAYS_BY_KEY
                and (send.window_ends is None or now + target.answer_seconds > send.window_ends)
            ):
                return never_sent(send, "replay_window_passed")
            if not token:
                assert bucket is not None
                try:
                    pause = await bucket.acquire()
                except Exception as exc:  # the quota's row out of reach: nothing sent
                    why = f"QuotaUnavailable: {error_text(exc)}"
                    return answered(send, NotStartedInTime(why, provider=target.name), policy)
                if pause is not None:  # the provider asked the fleet for a long pause
                    return paused(send, f"quota {bucket.name}", pause)
                token = True
                continue  # the lease and the circuit again, after the wait
            reply: ProviderReceipt | BaseException | None
            try:
                if effect is None:
                    effect = await self._effect(send)
                if ask_first:
                    assert isinstance(target, LooksUp)  # checked when the worker started
                    reply = await target.look_up(effect, send.ids, deadline=answer_by)
                else:
                    reply = await target.send(effect, send.ids, deadline=answer_by)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # translated by answered(); a bug is unknown
                reply = exc
            token = bucket is None  # used (or never needed)
            if reply is None:  # the provider never had it: now call
                ask_first = False
                continue
            circuit.observe(probe_result(reply), getattr(reply, "reason", ""))
            if bucket is not None and asks_pause(reply):
                assert isinstance(reply, TransientProviderError) and reply.retry_after
                await bucket.pause(reply.retry_after)
            if isinstance(reply, NotStartedInTime) and not lease.lost:
                await self._renewal()  # nothing sent: try again on the renewed lease
                continue
            return answered(send, reply, policy, looked_up=ask_first)

    async def _effect(self, send: Send) -> object:
        """What the send carries, built by the queue's kind; nothing is sent if it fails."""
        try:
            return await self.effects.kind.effect(
                send.job, send.target.target_index, send.recipient, tenant=send.target.key.tenant
            )
        except (ProviderError, asyncio.CancelledError):
            raise
        except Exception as exc:
            reason = f"effect_not_built: {error_text(exc)}"
            raise TransientProviderError(reason, provider=send.provider) from exc

    async def _renewal(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.lease.renewed.wait(), self.lease.lease_seconds)
