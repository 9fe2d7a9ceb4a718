"""A batch's send lease, followed by the work: renewed while the worker makes progress.

Every target a batch holds in `sending` carries one expiry (chunks taken later
join it). The worker knows it by two clocks: PostgreSQL's value, which a
renewal compares-and-sets, and a local end on `time.monotonic()`, taken before
the statement that set it, so it is never later than the real one.

1. a send starts only while `answer_by()` (the end, less LEASE_MARGIN of the
   lease to record the answer) leaves the provider's `answer_seconds`;
2. every EXTEND_EVERY of the lease, one statement renews the lease of every
   job the batch still holds (`SendLedger.extend`), from a task of its own, so
   a slow recording does not hold it back; the local end moves to the
   statement's start plus the lease;
3. a renewal that fails (an error, no answer within the lease's remainder, or
   a row of ours not renewed: its lease lapsed or another worker took it) loses
   the lease for good: `lost` is set and no send of the batch starts again.

With renewals on time, the least lease a send can meet is the lease less one
renewal period and one renewal's own time: `usable_seconds` is what the start
check (`check_lease`) holds a provider's `answer_seconds` against.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import asyncpg
import structlog

from consumers.message.decisions import ConfigurationError
from dedupe import DedupeKey, SendLedger
from dedupe.lost import dropped_if_demoted
from providers import LooksUp, PlatformRouter, RecoveryKind, Sender

log = structlog.get_logger(__name__)

# Renewals given up at their lease's end, still giving their connection back.
_outliving: set[asyncio.Task[object]] = set()

LEASE_MARGIN = 0.1  # of the lease, kept at its end to record the last answers
EXTEND_EVERY = 0.1  # of the lease: how often a held lease is renewed
RENEWAL_ALLOWANCE = 0.1  # of the lease: what a renewal itself may take, on time


class LeaseTooShort(ConfigurationError):
    """No send could ever start: the lease leaves less than the provider's answer time."""


def usable_seconds(lease_seconds: float) -> float:
    """The least time a send can find before `answer_by()` while renewals are on time."""
    return lease_seconds * (1 - LEASE_MARGIN - EXTEND_EVERY - RENEWAL_ALLOWANCE)


def check_lease(queue: str, lease_seconds: float, provider: Sender[Any]) -> None:
    """Refuse, in one line naming the setting, a lease under which no send can start.

    The rule the sends follow (`Lease.answer_by()` less the provider's
    `answer_seconds`, with renewals on time), checked once for each provider."""
    inner = provider.senders if isinstance(provider, PlatformRouter) else (provider,)
    usable = usable_seconds(lease_seconds)
    for one in inner:
        if usable < one.answer_seconds:
            least = one.answer_seconds / (usable / lease_seconds)
            raise LeaseTooShort(
                f"queue {queue}: lease_seconds={lease_seconds:g} leaves {usable:.2f} s to start"
                f" a send, {one.name} needs {one.answer_seconds:g} s (its timeouts): set"
                f" lease_seconds to at least {least:.1f}, or lower {one.name}'s timeout_seconds"
            )


def check_recovery(queue: str, provider: Sender[Any]) -> None:
    """Refuse a sender that says its provider can be asked by our key, and cannot ask."""
    inner = provider.senders if isinstance(provider, PlatformRouter) else (provider,)
    for one in inner:
        if one.recovery.kind is RecoveryKind.LOOKUP_BY_KEY and not isinstance(one, LooksUp):
            raise ConfigurationError(
                f"queue {queue}: {one.name} offers lookup by key (its recovery) but has no"
                " look_up method: give it one, or declare another recovery"
            )


def _outlived(renewal: asyncio.Task[object]) -> None:
    """A renewal given up has ended: its error, if any, was the lease's loss already."""
    _outliving.discard(renewal)
    if not renewal.cancelled():
        renewal.exception()  # retrieved: asyncio would log it as never retrieved


class Lease:
    """The lease a batch holds on its jobs' `sending` rows (see the module docstring)."""

    def __init__(
        self, ledger: SendLedger, *, expires_at: datetime, ends: float, lease_seconds: float
    ) -> None:
        self.ledger = ledger
        self.expires_at = expires_at  # PostgreSQL's value: the compare-and-set's old expiry
        self.ends = ends  # time.monotonic(), never later than the real end
        self.lease_seconds = lease_seconds
        self.lost = False
        self.renewed = asyncio.Event()  # set at each renewal (and when lost): waiters recheck
        self._last = ends - lease_seconds

    def answer_by(self) -> float:
        """The deadline a send is given: the lease's end less the time to record its answer."""
        return -float("inf") if self.lost else self.ends - LEASE_MARGIN * self.lease_seconds

    def due_in(self) -> float:
        """Seconds until the next renewal is due."""
        return max(0.0, self._last + EXTEND_EVERY * self.lease_seconds - time.monotonic())

    async def extend(
        self, pool: asyncpg.Pool, writes: asyncio.Lock, held: Callable[[], Mapping[DedupeKey, int]]
    ) -> None:
        """Step 2: renew the lease of `held()` (per job, the rows we lease, unrecorded).

        `writes` is the batch's lock on its ledger writes: what `held()` says is
        what the ledger holds while it is taken. Waiting for it counts against
        the lease: a renewal stuck behind a recording the database does not
        answer fails when the lease ends.

        The renewal runs in a task of its own and is waited for until the lease
        ends, no longer: a statement on a connection that stopped answering is
        cancelled, but its connection goes back to the pool only once the
        pool's reset gets through (asyncpg), and a wait for that would record
        the loss as late as the connection comes back. The lease is lost at its
        end; the task finishes giving its connection back on its own."""
        if self.lost:
            return
        started = time.monotonic()
        self._last = started
        renewal = asyncio.create_task(self._renew(pool, writes, held))
        try:
            done, _ = await asyncio.wait({renewal}, timeout=max(0.0, self.ends - started))
        except asyncio.CancelledError:  # the batch holds nothing more
            renewal.cancel()
            raise
        if not done:  # step 3: no answer within the lease's remainder
            renewal.cancel()
            _outliving.add(renewal)
            renewal.add_done_callback(_outlived)
            self._lose(f"no answer within the lease's {self.ends - started:.2f} s left")
            return
        try:
            answer = renewal.result()
        except Exception as exc:  # step 3: any failure ends the lease here
            self._lose(f"{type(exc).__name__}: {exc}")
            return
        if answer is None:  # nothing held: nothing to renew
            return
        rows, expiry, renewed = answer
        short = {key: n for key, n in rows.items() if renewed.get(key, 0) < n}
        if short:
            self._lose(f"{len(short)} jobs' rows not renewed (lapsed or taken over)")
            return
        self.expires_at = expiry
        self.ends = started + self.lease_seconds
        self.renewed.set()
        self.renewed.clear()

    async def _renew(
        self, pool: asyncpg.Pool, writes: asyncio.Lock, held: Callable[[], Mapping[DedupeKey, int]]
    ) -> tuple[Mapping[DedupeKey, int], datetime, Mapping[DedupeKey, int]] | None:
        """One renewal statement under the batch's write lock: what was held and renewed."""
        async with writes:
            rows = held()
            if not rows:
                return None
            async with pool.acquire() as conn, dropped_if_demoted(conn):
                expiry, renewed = await self.ledger.extend(
                    conn, list(rows), self.expires_at, self.lease_seconds
                )
        return rows, expiry, renewed

    async def keep(
        self, pool: asyncpg.Pool, writes: asyncio.Lock, held: Callable[[], Mapping[DedupeKey, int]]
    ) -> None:
        """Renew when due until lost (or cancelled: the batch holds nothing more)."""
        while not self.lost:
            await asyncio.sleep(self.due_in())
            await self.extend(pool, writes, held)

    def _lose(self, why: str) -> None:
        self.lost = True
        self.renewed.set()
        log.warning("send_lease_lost", reason=why, lease_s=self.lease_seconds)
