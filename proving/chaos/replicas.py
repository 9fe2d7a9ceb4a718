"""A PostgreSQL primary with one synchronous standby, on free ports, for tests.

    async with StandbyPair(workdir) as pair:
        pair.dsn                          # both hosts, target_session_attrs=read-write
        await pair.standby.stop()         # commits on the primary now wait for it
        await pair.wait_commits_waiting(1, since=t)  # backends in the SyncRep wait
        await pair.cancel_waiting_commits()          # pg_cancel_backend of each
        pair.primary.kill_now()           # SIGKILL of the postmaster
        await pair.promote()              # the standby, restarted, is the primary

The primary runs with `synchronous_standby_names = '*'`, so every writing
COMMIT waits for the standby's flush; the standby is a `pg_basebackup -R` of
it that names no standby of its own, so once promoted its commits wait for
nobody. Both are `PrivatePostgres` children (parent-death signal, their
state under `workdir`); `__aexit__` kills both and removes `workdir`, also
when the body raised.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import pwd
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import asyncpg

from proving.chaos.services import PG_BIN, PrivatePostgres, ServiceError, free_port, remove_tree
from proving.deadlines import ANSWER_S

PRIMARY_SETTINGS = {"synchronous_standby_names": "*", "wal_sender_timeout": "10s"}
STANDBY_SETTINGS = {"synchronous_standby_names": "", "wal_receiver_status_interval": "1s"}


class PrivateStandby(PrivatePostgres):
    """A streaming standby of `primary`, made by pg_basebackup instead of initdb."""

    def __init__(self, base: Path, port: int, primary: PrivatePostgres) -> None:
        super().__init__(base, port, settings=STANDBY_SETTINGS)
        self.primary = primary

    def init(self) -> None:
        user = self._os_user()
        self.base.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (self.base, self.sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [
                str(PG_BIN / "pg_basebackup"),
                "-D",
                str(self.data),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.primary.port),
                "-U",
                "postgres",
                "-R",  # standby.signal and primary_conninfo
                "-X",
                "stream",
                "--no-sync",
            ],
            check=True,
            user=user,
            group=user,
            env=dict(self.child.env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
        )


class StandbyPair:
    """A primary whose commits wait for one synchronous standby."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.primary = PrivatePostgres(workdir / "primary", free_port(), settings=PRIMARY_SETTINGS)
        self.standby = PrivateStandby(workdir / "standby", free_port(), self.primary)

    @property
    def dsn(self) -> str:
        """Both servers in one URL: asyncpg connects to whichever accepts writes."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    async def start(self, patience: float = 60.0) -> None:
        self.primary.init()
        await self.primary.start()
        self.standby.init()
        await self.standby.start()
        await self.wait_streaming(synchronous=True, patience=patience)

    async def wait_streaming(self, *, synchronous: bool, patience: float = 60.0) -> None:
        """Until the primary has its standby streaming (as the synchronous one, if asked)."""
        state = "sync" if synchronous else "async"
        await self._until(
            f"SELECT count(*) FROM pg_stat_replication WHERE sync_state = '{state}'",
            lambda n: n == 1,
            patience,
            f"the standby streaming as the {state} one",
        )

    async def wait_commits_waiting(
        self, n: int, *, since: datetime.datetime, patience: float = 60.0
    ) -> list[int]:
        """The pids of at least `n` backends whose COMMIT (begun after `since`) waits."""
        await self._until(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            f" AND xact_start > '{since.isoformat()}'::timestamptz",
            lambda found: found >= n,
            patience,
            f"{n} commits begun after {since} waiting for the standby",
        )
        conn = await asyncpg.connect(self.primary.url, timeout=ANSWER_S)
        try:
            rows = await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND xact_start > $1",
                since,
                timeout=ANSWER_S,
            )
        finally:
            await conn.close()
        return [row["pid"] for row in rows]

    async def cancel_waiting_commits(self, *, terminate: bool = False) -> datetime.datetime:
        """pg_cancel_backend (or pg_terminate_backend) every waiting COMMIT; the server's now()."""
        call = "pg_terminate_backend" if terminate else "pg_cancel_backend"
        conn = await asyncpg.connect(self.primary.url, timeout=ANSWER_S)
        try:
            row = await conn.fetchrow(
                f"SELECT now() AS at, count({call}(pid)) AS signalled"
                " FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                timeout=ANSWER_S,
            )
            assert row is not None  # an aggregate: always one row
            now: datetime.datetime = row["at"]
        finally:
            await conn.close()
        return now

    async def promote(self, patience: float = 60.0) -> None:
        """Start the standby if it is stopped and make it the primary."""
        await self.standby.start()
        conn = await asyncpg.connect(self.standby.url, timeout=ANSWER_S)
        try:
            # pg_promote waits up to its own 60 s (wait_seconds) for the promotion.
            await conn.execute("SELECT pg_promote(wait => true)", timeout=60 + ANSWER_S)
        finally:
            await conn.close()
        await self._until(
            "SELECT CASE WHEN pg_is_in_recovery() THEN 0 ELSE 1 END",
            lambda n: n == 1,
            patience,
            "the promoted standby out of recovery",
            url=self.standby.url,
        )

    async def _until(
        self,
        sql: str,
        done: Callable[[Any], bool],
        patience: float,
        what: str,
        *,
        url: str | None = None,
    ) -> None:
        deadline = asyncio.get_running_loop().time() + patience
        last: object = None
        while True:
            try:
                conn = await asyncpg.connect(url or self.primary.url, timeout=ANSWER_S)
                try:
                    last = await conn.fetchval(sql, timeout=ANSWER_S)
                finally:
                    await conn.close()
                if done(last):
                    return
            except (OSError, asyncpg.PostgresError) as exc:
                last = exc
            if asyncio.get_running_loop().time() > deadline:
                raise ServiceError(f"no {what} within {patience} s (last: {last!r})")
            await asyncio.sleep(0.1)

    def kill_now(self) -> None:
        self.primary.kill_now()
        self.standby.kill_now()

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            self.kill_now()
            remove_tree(self.workdir)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.kill_now()
        remove_tree(self.workdir)
