"""Provider quotas the whole fleet keeps: tokens taken from PostgreSQL in batches, pauses told
to every worker.

A provider's quota is its project's (FCM: 600,000 messages a minute per
Firebase project; APNs throttles by topic), shared by every worker sending to
it. Each quota configured (`QuotaSettings`, IW_PROVIDER_QUOTAS) is one row of
`provider_quotas`, a token bucket (`dedupe.quota`), and in each worker process
one `Bucket`:

1. a send takes one token before its call (`acquire`); the process takes
   tokens from the row in batches, one statement for many sends (about what it
   used of its last batch, doubled while it runs out, at most
   STASH_SECONDS of the quota's rate), so the hot path does not gain a round
   trip per send; one take at a time per process, the other sends wait for it;
2. tokens are used within STASH_SECONDS of the statement that took them, or
   dropped: over any T seconds the fleet's sends stay within the bucket's
   `burst + per_second * (T + STASH_SECONDS)`, however many workers;
3. an empty bucket: the take waits until the next whole token is due (at most
   a second) and takes again; the sends wait in line behind it;
4. a provider answering with a Retry-After (a 429, a 503) pauses the quota: the
   worker that got it stops at once (tokens dropped), writes the pause to the
   row and NOTIFYs; every worker LISTENing stops before its next send, and one
   whose notice was lost learns it at its next take. A send meeting a pause of
   at most PAUSE_WAIT_SECONDS waits it out; a longer one is not made (`acquire`
   says how long: the runner defers it, no attempt spent).

A sender's quota is found by its `quota_name` (ApnsProvider: `apns:<topic>`),
else by its `name` (`fcm`); a sender with no quota configured takes no token.
Metrics: the quota's rate (`provider_quota_per_second`), the tokens used
(`provider_quota_sends_total`), the time sends waited for one
(`provider_quota_wait_seconds`), the pauses written (`provider_quota_pauses_total`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import asyncpg
import structlog

from consumers.fleet import ProviderQuota
from consumers.settings import Settings
from consumers.telemetry.metrics import Metrics
from dedupe import QUOTA_CHANNEL, ProviderQuotas, paused_notice
from dedupe.lost import dropped_if_demoted
from providers import PlatformRouter, Sender

log = structlog.get_logger(__name__)

STASH_SECONDS = 0.1  # tokens taken are used within this, or dropped (2.)
PAUSE_WAIT_SECONDS = 5.0  # a pause this short is waited out in place (4.)
LONGEST_TOKEN_WAIT = 1.0  # an empty bucket is asked again at least this often (3.)
LISTEN_RETRY_SECONDS = 5.0  # a lost LISTEN connection is opened again this often


def quota_name(sender: Sender[Any]) -> str:
    """The quota a sender's calls count against: its `quota_name`, else its `name`."""
    named = getattr(sender, "quota_name", None)
    return named if isinstance(named, str) and named else sender.name


class Bucket:
    """One quota's tokens in this process (steps 1 to 4)."""

    def __init__(
        self,
        *,
        name: str,
        quota: ProviderQuota,
        pool: asyncpg.Pool,
        table: ProviderQuotas,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.quota = quota
        self.pool = pool
        self.table = table
        self.most = max(1, math.floor(quota.per_second * STASH_SECONDS))
        self._tokens = 0
        self._expires = 0.0  # time.monotonic() after which the tokens are dropped (2.)
        self._size = 1  # the next take's
        self._taken = 0  # the last take's
        self._paused_until = 0.0  # time.monotonic()
        self._waiting = 0
        self._taking = asyncio.Lock()
        self._used = metrics.quota_sends.labels(name)
        self._waited = metrics.quota_wait_seconds.labels(name)
        self._pauses = metrics.quota_pauses.labels(name)

    async def configure(self) -> None:
        async with self.pool.acquire() as conn, dropped_if_demoted(conn):
            await self.table.configure(conn, self.name, self.quota.per_second, self.quota.bucket)

    def paused_for(self) -> float:
        """Seconds of a pause left (0: none)."""
        return max(0.0, self._paused_until - time.monotonic())

    async def acquire(self) -> float | None:
        """One send's token (1.); None once it has one, or the seconds of a pause longer
        than PAUSE_WAIT_SECONDS (4.): that send is not to be made now."""
        started = time.monotonic()
        while True:
            now = time.monotonic()
            pause = self._paused_until - now
            if pause > 0:
                if pause > PAUSE_WAIT_SECONDS:
                    return pause
                await asyncio.sleep(pause)
                continue
            if self._tokens and now < self._expires:
                self._tokens -= 1
                self._used.inc()
                self._waited.observe(now - started)
                return None
            self._waiting += 1
            try:
                await self._take()
            finally:
                self._waiting -= 1

    async def _take(self) -> None:
        """One statement for this process's next tokens (1.), or a wait for them (3.)."""
        async with self._taking:
            now = time.monotonic()
            if (self._tokens and now < self._expires) or self._paused_until > now:
                return  # another send took them (or a pause came) while this one waited
            if self._taken:  # what the last take was used for sizes this one (1.)
                left = self._tokens
                used = self._taken - left
                self._size = max(1, used * 2 if not left else used)
            size = min(self.most, max(self._size, self._waiting))
            started = time.monotonic()
            async with self.pool.acquire() as conn, dropped_if_demoted(conn):
                grant = await self.table.take(conn, self.name, size)
                if grant is None:  # the row is gone: write it again, ask again
                    await self.table.configure(
                        conn, self.name, self.quota.per_second, self.quota.bucket
                    )
                    return
            if grant.paused_seconds > 0:  # a pause whose notice did not reach us (4.)
                self._drop(started + grant.paused_seconds)
                return
            self._tokens = self._taken = grant.granted
            self._expires = started + STASH_SECONDS  # the statement's start: never later
            if not grant.granted:  # empty (3.): until the next whole token is due
                due = (1.0 - grant.left) / grant.per_second
                await asyncio.sleep(min(LONGEST_TOKEN_WAIT, max(0.001, due)))

    async def pause(self, seconds: float) -> None:
        """A provider asked for `seconds` without calls (4.): stop here at once, then tell
        the fleet through the row. A failure to write it is logged: this worker still
        keeps the pause."""
        self._drop(time.monotonic() + seconds)
        self._pauses.inc()
        log.warning("provider_quota_paused", quota=self.name, seconds=seconds)
        try:
            async with self.pool.acquire() as conn, dropped_if_demoted(conn):
                await self.table.pause(conn, self.name, seconds)
        except Exception as exc:
            log.warning("provider_quota_pause_not_shared", quota=self.name, error=repr(exc))

    def paused_by_fleet(self, seconds: float) -> None:
        """Another worker wrote a pause (4.): `seconds` left, by PostgreSQL's clock."""
        self._drop(time.monotonic() + seconds)

    def _drop(self, until: float) -> None:
        self._paused_until = max(self._paused_until, until)
        self._tokens = 0


class FleetQuotas:
    """A worker process's buckets, by quota name, and the LISTEN connection that tells it
    the fleet's pauses."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool, metrics: Metrics) -> None:
        self.settings = settings
        self.table = ProviderQuotas(settings.database.schema)
        self.buckets = {
            name: Bucket(name=name, quota=quota, pool=pool, table=self.table, metrics=metrics)
            for name, quota in settings.quotas.limits.items()
        }
        for name, quota in settings.quotas.limits.items():
            metrics.quota_per_second.labels(name).set(quota.per_second)
        self._listener: asyncpg.Connection[asyncpg.Record] | None = None
        self._keeping: asyncio.Task[None] | None = None

    def of(self, sender: Sender[Any]) -> Bucket | None:
        """The bucket of `sender`'s quota (by `quota_name`, then `name`); None: none set."""
        if not self.buckets:
            return None
        return self.buckets.get(quota_name(sender)) or self.buckets.get(sender.name)

    def check(self, provider: Sender[Any]) -> None:
        """Say at start which quota each sender of `provider` takes its tokens from."""
        inner = provider.senders if isinstance(provider, PlatformRouter) else (provider,)
        for sender in inner:
            bucket = self.of(sender)
            log.info(
                "provider_quota",
                provider=sender.name,
                quota=quota_name(sender),
                kept=bucket.name if bucket is not None else None,
                per_second=bucket.quota.per_second if bucket is not None else None,
            )

    async def start(self) -> None:
        """Write each quota's row, and listen for pauses (when any quota is set)."""
        if not self.buckets:
            return
        for bucket in self.buckets.values():
            await bucket.configure()
        await self._listen()
        self._keeping = asyncio.create_task(self._keep_listening(), name="quota:listen")

    async def close(self) -> None:
        if self._keeping is not None:
            self._keeping.cancel()
            await asyncio.gather(self._keeping, return_exceptions=True)
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        notice = paused_notice(str(payload), self.table.schema)
        if notice is not None and notice[0] in self.buckets:
            self.buckets[notice[0]].paused_by_fleet(notice[1])

    async def _listen(self) -> None:
        try:
            listener = await asyncpg.connect(self.settings.database.url, timeout=10)
            await listener.add_listener(QUOTA_CHANNEL, self._notified)
        except Exception as exc:  # the takes still read the pause (4.)
            log.warning("provider_quota_listen_failed", error=repr(exc))
            return
        self._listener = listener

    async def _keep_listening(self) -> None:
        while True:
            await asyncio.sleep(LISTEN_RETRY_SECONDS)
            if self._listener is None or self._listener.is_closed():
                await self._listen()
