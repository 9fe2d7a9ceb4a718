"""The demo's worker processes, the one SIGKILL, and what the workers' logs say.

The SIGKILL is aimed mid-call: once the order effects are under way, the
victim is killed as soon as it holds calls `sending` of every send channel not
yet finished, HELD_AT_LEAST of them in all (or at the latest once most sends
are settled), so calls are on the wire when it dies. What it held then is read at once
(`proving.crash_window.died`): the report counts against it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from dedupe import DbConnection
from proving.crash_window import Death, answers_lost, died
from proving.deadlines import ANSWER_S

HELD_AT_LEAST = 8


class Workers:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.kills = 0

    def start(self) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"worker-{len(self.procs)}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "consumers", "run", "proving.demo.app:app"],
            env=self.env,
            stdout=log,
            stderr=log,
        )
        log.close()
        self.procs.append(proc)
        return proc

    async def kill(self, proc: subprocess.Popen[bytes], db: DbConnection) -> Death:
        """SIGKILL `proc`, and read the ledger rows it held as it died."""
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=ANSWER_S)  # a SIGKILLed process is gone in milliseconds
        self.kills += 1
        return await died(db, proc.pid)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def kill_now(
    db: DbConnection, pid: int, *, unfinished: Sequence[str], under_way: bool, late: bool
) -> bool:
    """Whether to SIGKILL worker `pid` now: it holds calls of every send queue in
    `unfinished`, HELD_AT_LEAST in all (`under_way`: the local effects are), or it is
    `late`."""
    if late:
        return True
    if not under_way or not unfinished:
        return False
    held = await db.fetchrow(
        "SELECT count(DISTINCT consumer) AS channels, count(*) AS calls FROM send_ledger"
        " WHERE status = 'sending' AND lease_owner LIKE $1 AND consumer = ANY($2::text[])",
        f"%:{pid}:%",
        list(unfinished),
        timeout=ANSWER_S,
    )
    return (
        held is not None and held["channels"] == len(unfinished) and held["calls"] >= HELD_AT_LEAST
    )


def unknown_outcomes(log_dir: Path) -> int:
    """Sends the workers logged with an unknown outcome: a timeout or a lost connection.

    The demo injects no such fault but the kill, so each one is a defect to look at,
    like the burst that broke the fake APNs' stream limit in the push bench (every
    request on the connection unknown, then sent again: a second arrival at the fake,
    which the receivers' count fails). A send re-leased after the SIGKILLed worker's
    lease expired is not one.
    """
    return sum(answers_lost(log_dir).values())
