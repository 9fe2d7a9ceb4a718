"""The pg-failover profiles and their schedule of faults (proving.chaos.pg_failover)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from proving.chaos.patroni import Member, PatroniCluster
from proving.chaos.run import say

# Before a kill the leader's WAL senders are paused this long: what it commits
# then reaches no replica. With synchronous replication those commits wait and
# are never acked; without (the control) they are acked and die with the leader.
LAG_BEFORE_KILL_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PgProfile:
    name: str
    messages: int
    workers: int
    relays: int
    ingress_requests: int  # push jobs sent to `serve` over the load
    load_seconds: float
    primary_kills: int
    switchovers: int
    standby_stops: int
    nodes: int = 3
    drain_seconds: float = 120.0


PG_FAILOVER = PgProfile(
    name="pg-failover",
    messages=20_000,
    workers=3,
    relays=2,
    ingress_requests=1_000,
    load_seconds=300.0,
    primary_kills=10,
    switchovers=3,
    standby_stops=3,
)
PG_FAILOVER_CI = PgProfile(
    name="pg-failover-ci",
    messages=2_000,
    workers=2,
    relays=2,
    ingress_requests=200,
    load_seconds=60.0,
    primary_kills=2,
    switchovers=1,
    standby_stops=1,
    drain_seconds=60.0,
)
PG_PROFILES = {p.name: p for p in (PG_FAILOVER, PG_FAILOVER_CI)}


@dataclass(slots=True, kw_only=True)
class PgFaults:
    primary_kills: int = 0
    switchovers: int = 0
    standby_stops: int = 0
    failovers: int = 0  # leader changes
    # Per leader change, wall-clock (first act, new leader seen): where its
    # pause in commits is looked for (proving.chaos.pg_figures.largest_gaps).
    windows: list[tuple[float, float]] = field(default_factory=list)
    election_s: list[float] = field(default_factory=list)  # kill to a new leader


def _walsenders(m: Member) -> list[int]:
    """The WAL sender processes of the member's PostgreSQL (children of its postmaster).

    A sender paused with SIGSTOP sends nothing more; what it wrote before is in
    the socket and reaches the replica, what the leader commits after does not
    (pausing the replicas' receivers instead loses nothing: the kernel's socket
    buffers hold seconds of WAL, and a resumed receiver reads them all).
    """
    postmaster = m.postmaster_pid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == postmaster and b"walsender" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


async def _kill_primary(cluster: PatroniCluster, faults: PgFaults) -> None:
    leader = await cluster.wait_leader()
    first_act = time.time()
    paused = _walsenders(leader)
    for pid in paused:  # the replicas fall behind: commits that do not wait for them race ahead
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    await asyncio.sleep(LAG_BEFORE_KILL_S)
    began = time.monotonic()
    # The paused senders die stopped, with their postmaster: they send nothing more.
    await cluster.kill(leader, also=paused)
    new = await cluster.wait_leader(other_than=leader, patience=90)
    faults.election_s.append(time.monotonic() - began)
    faults.windows.append((first_act, time.time()))
    faults.primary_kills += 1
    faults.failovers += 1
    say(
        f"primary kill {faults.primary_kills}: {leader.name} -> {new.name}"
        f" in {faults.election_s[-1]:.1f} s"
    )
    await cluster.start(leader)
    await cluster.wait_streaming(len(cluster.members) - 1, patience=180)


async def _switchover(cluster: PatroniCluster, faults: PgFaults) -> None:
    first_act = time.time()
    old, new = await cluster.switchover()
    faults.windows.append((first_act, time.time()))
    faults.switchovers += 1
    faults.failovers += 1
    say(f"switchover {faults.switchovers}: {old.name} -> {new.name}")
    await cluster.wait_streaming(len(cluster.members) - 1, patience=180)


async def _stop_standby(cluster: PatroniCluster, faults: PgFaults) -> None:
    standby = await cluster.sync_standby() if cluster.synchronous else None
    if standby is None:
        leader = await cluster.wait_leader()
        standby = next(m for m in cluster.members if m is not leader)
    await cluster.stop_postgres(standby)
    faults.standby_stops += 1
    say(f"standby stop {faults.standby_stops}: {standby.name}")
    await cluster.wait_streaming(len(cluster.members) - 1, patience=180)


async def run_schedule(
    cluster: PatroniCluster, profile: PgProfile, faults: PgFaults, started: float
) -> None:
    """Kills, switchovers and standby stops in turn, spread over the load."""
    steps = (
        ["kill"] * profile.primary_kills
        + ["switchover"] * profile.switchovers
        + ["stop"] * profile.standby_stops
    )
    order = sorted(range(len(steps)), key=lambda i: (i % max(profile.primary_kills, 1), i))
    slot = 0.85 * profile.load_seconds / max(len(steps), 1)
    for n, index in enumerate(order):
        if (wait := started + 0.05 * profile.load_seconds + n * slot - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        step = steps[index]
        if step == "kill":
            await _kill_primary(cluster, faults)
        elif step == "switchover":
            await _switchover(cluster, faults)
        else:
            await _stop_standby(cluster, faults)
