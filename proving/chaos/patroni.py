"""A local Patroni cluster: one etcd and 3 PostgreSQL 15 nodes, `synchronous_mode: true`.

    async with PatroniCluster(workdir) as cluster:      # 3 nodes unless told
        cluster.dsn                       # every node, target_session_attrs=read-write
        leader = await cluster.leader()   # the member holding the leader key
        await cluster.kill(leader)        # SIGKILL of its Patroni and its postmaster
        await cluster.wait_leader(other_than=leader)
        await cluster.start(leader)       # back as a replica (pg_rewind if it must)
        await cluster.switchover()        # `patronictl switchover --force`
        await cluster.stop_postgres(await cluster.sync_standby())

Debian's packages: `patroni` (3.0) and `etcd-server` (3.4, the v3 API:
Patroni's `etcd3` section). Every port is free on 127.0.0.1; every file is
under `workdir`; PostgreSQL and Patroni run as the postgres user. The DCS
timings are short (ttl 10 s, loop_wait 1 s) so a failover takes seconds.

Patroni and etcd are direct children with a parent-death SIGKILL; a
postmaster is Patroni's child and outlives a SIGKILLed Patroni, so a kill
takes both (the postmaster's pid from `postmaster.pid`). `__aexit__` kills
everything and removes `workdir`, also when the body raised. Processes of a
dead run (the run's pid in their command line, `iw-pgcluster-<pid>-`) are
killed before a start; other live runs keep theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import re
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from proving.chaos.patroni_config import patroni_config
from proving.chaos.services import ServiceError, _dies_with_parent, free_port, remove_tree
from proving.deadlines import within

ETCD = "/usr/bin/etcd"
PATRONI = "/usr/bin/patroni"
PATRONICTL = "/usr/bin/patronictl"
PREFIX = "iw-pgcluster-"
USER = "postgres"


def new_workdir() -> Path:
    """A directory the postgres user can enter, named after this run (for leftovers)."""
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    os.chmod(path, 0o755)
    return path


def kill_leftovers() -> int:
    """SIGKILL etcd, Patroni and postgres processes of runs that are gone; return how many."""
    mark = re.compile(rf"{PREFIX}(\d+)-")
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found = mark.search(argv)
        if found is None or _alive(int(found.group(1))):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(entry.name), signal.SIGKILL)
            killed += 1
    return killed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _as_user() -> str | None:
    return USER if os.geteuid() == 0 else None


def _spawn(argv: list[str], log: Path, *, user: str | None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            user=user,
            group=user,
            start_new_session=True,
            preexec_fn=_dies_with_parent(signal.SIGKILL),
        )


@dataclass(slots=True, kw_only=True)
class Member:
    """One node: its Patroni process, REST API and PostgreSQL port."""

    name: str
    base: Path
    port: int
    api_port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.base / "patroni.yml"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.base / "data" / "postmaster.pid").read_text().split()[0])
        return None


class PatroniCluster:
    """`size` PostgreSQL nodes under Patroni, one etcd, synchronous replication."""

    def __init__(self, workdir: Path, *, size: int = 3, synchronous: bool = True) -> None:
        self.workdir = workdir
        self.scope = f"iw{os.getpid()}"
        self.synchronous = synchronous
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.members = [
            Member(
                name=f"node{i}", base=workdir / f"node{i}", port=free_port(), api_port=free_port()
            )
            for i in range(size)
        ]

    @property
    def dsn(self) -> str:
        hosts = ",".join(f"127.0.0.1:{m.port}" for m in self.members)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    # -- life cycle ------------------------------------------------------

    async def __aenter__(self) -> Self:
        try:
            await self.start_all()
        except BaseException:
            self.kill_now()
            remove_tree(self.workdir)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.kill_now()
        remove_tree(self.workdir)

    async def start_all(self, patience: float = 120.0) -> None:
        kill_leftovers()
        self._start_etcd()
        await self._until(lambda: self._etcd_healthy(), patience, "etcd answering")
        for member in self.members:
            self._write_config(member)
        await self.start(self.members[0])
        await self.wait_leader(patience=patience)
        for member in self.members[1:]:
            await self.start(member)
        await self.wait_streaming(len(self.members) - 1, patience=patience)

    def _start_etcd(self) -> None:
        data = self.workdir / "etcd"
        data.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self.etcd = _spawn(
            [
                ETCD,
                "--name",
                "etcd0",
                "--data-dir",
                str(data),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"etcd0={peer}",
                "--log-level",
                "warn",
            ],
            self.workdir / "etcd.log",
            user=None,
        )

    def _write_config(self, m: Member) -> None:
        m.base.mkdir(parents=True, exist_ok=True)
        (m.base / "sockets").mkdir(exist_ok=True)
        user = _as_user()
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (m.base, m.base / "sockets"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        config = patroni_config(
            name=m.name,
            base=m.base,
            port=m.port,
            api_port=m.api_port,
            scope=self.scope,
            etcd_port=self.etcd_port,
            synchronous=self.synchronous,
        )
        m.config.write_text(json.dumps(config, indent=1))  # JSON is YAML

    async def start(self, m: Member) -> None:
        """Start the member's Patroni (which starts its PostgreSQL)."""
        if m.proc is not None and m.proc.poll() is None:
            return
        m.proc = _spawn([PATRONI, str(m.config)], m.base / "patroni.log", user=_as_user())

    async def kill(self, m: Member, *, also: Sequence[int] = ()) -> None:
        """SIGKILL the member's Patroni, its postmaster, then the pids in `also`."""
        pid = m.postmaster_pid()
        if m.proc is not None and m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()
        for victim in ([] if pid is None else [pid]) + list(also):
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        if pid is not None:
            await self._until(lambda: _gone(pid), 30, f"postmaster {pid} of {m.name} gone")

    async def stop_postgres(self, m: Member) -> None:
        """A fast shutdown of the member's PostgreSQL (Patroni, still running, restarts it)."""
        pid = m.postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)

    def kill_now(self) -> None:
        pids = [m.postmaster_pid() for m in self.members]
        for proc in [m.proc for m in self.members] + [self.etcd]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        for pid in pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    # -- asking the cluster ---------------------------------------------

    def member_named(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    async def state(self) -> list[dict[str, Any]]:
        """The members as Patroni's /cluster lists them (asked of any node that answers)."""
        for m in self.members:
            with contextlib.suppress(OSError, ValueError):
                body = await asyncio.to_thread(_get, f"http://127.0.0.1:{m.api_port}/cluster")
                members: list[dict[str, Any]] = json.loads(body).get("members", [])
                return members
        return []

    async def leader(self) -> Member | None:
        for row in await self.state():
            if row.get("role") == "leader" and row.get("state") == "running":
                return self.member_named(row["name"])
        return None

    async def sync_standby(self) -> Member | None:
        for row in await self.state():
            if row.get("role") == "sync_standby" and row.get("state") == "running":
                return self.member_named(row["name"])
        return None

    async def wait_leader(
        self, *, other_than: Member | None = None, patience: float = 60.0
    ) -> Member:
        found: list[Member] = []

        async def elected() -> bool:
            leader = await self.leader()
            if leader is None or leader is other_than:
                return False
            found.append(leader)
            return True

        await self._until(
            elected,
            patience,
            "a running leader" + (f" other than {other_than.name}" if other_than else ""),
        )
        return found[-1]

    async def wait_streaming(self, replicas: int, *, patience: float = 120.0) -> None:
        """Until `replicas` members are replicas (one the sync standby, if synchronous)."""

        async def streaming() -> bool:
            rows = await self.state()
            running = [
                r
                for r in rows
                if r.get("state") in ("running", "streaming") and r.get("role") != "leader"
            ]
            sync = any(r.get("role") == "sync_standby" for r in rows)
            return len(running) >= replicas and (sync or not self.synchronous)

        await self._until(streaming, patience, f"{replicas} replicas streaming")

    async def switchover(self, tries: int = 5) -> tuple[Member, Member]:
        """`patronictl switchover --force` from the leader to a running replica; (old, new).

        Patroni refuses a candidate that is not the sync standby (412), and
        which member that is can change between our read and its check: the
        switchover is asked again, with the members read anew, `tries` times.
        """
        said = ""
        for _ in range(tries):
            leader = await self.wait_leader()
            wanted = ("sync_standby",) if self.synchronous else ("sync_standby", "replica")
            candidates = [
                self.member_named(r["name"])
                for r in await self.state()
                if r.get("role") in wanted and r.get("state") in ("running", "streaming")
            ]
            if not candidates:
                await asyncio.sleep(1.0)
                continue
            candidate = candidates[0]
            proc = await asyncio.create_subprocess_exec(
                PATRONICTL,
                "-c",
                str(leader.config),
                "switchover",
                "--leader",
                leader.name,
                "--candidate",
                candidate.name,
                "--force",
                self.scope,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
            said = out.decode(errors="replace").strip()
            if proc.returncode == 0 and "Switchover failed" not in said:
                await self.wait_leader(other_than=leader)
                return leader, candidate
            await asyncio.sleep(1.0)
        raise ServiceError(f"patronictl switchover failed {tries} times: {said[-500:]}")

    async def _until(self, check: Any, patience: float, what: str) -> None:
        deadline = time.monotonic() + patience
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await within(patience, what, result)
            if result:
                return
            if time.monotonic() > deadline:
                raise ServiceError(f"no {what} within {patience} s; logs in {self.workdir}")
            await asyncio.sleep(0.2)

    async def _etcd_healthy(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            body = await asyncio.to_thread(_get, f"http://127.0.0.1:{self.etcd_port}/health")
            return bool(json.loads(body).get("health") == "true")
        return False


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as answer:
        return str(answer.read().decode())


def _gone(pid: int) -> bool:
    return not _alive(pid)
