"""The worker processes of a chaos run, kept alive whatever happens to them.

Each slot runs `python -m consumers run proving.chaos.app:app` (or, in the
relay fleet, `python -m proving.chaos.relay`) against the fault proxies. A
supervisor restarts a slot's process whenever it exits, and records why it
exited: killed by the run (SIGKILL), stopped by it (SIGTERM, which must exit
0), killed by its own fault injection at a crash point (an exit by SIGKILL
nobody sent), or failed to start (the broker or the database was down at
that moment).

A process start may be armed: `PROVING_CRASH_AT` and a random
`PROVING_CRASH_AFTER`, drawn from what is left of the run's quota of
kills at each crash point.

A worker whose handler blocks the event loop (a chaos.slow `hang` job) is
ended by its watchdog with exit 70 (EXIT_STUCK): expected, counted as a hang
and restarted, when a hang marker names its pid, whatever the run sent it
meanwhile (a SIGTERM cannot be handled by a blocked loop). An exit 70 no
marker explains is a stuck worker nobody planned: counted, its log kept. A
hanging worker is not picked for a SIGKILL, so each hang ends by its watchdog.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from consumers import CrashPoint
from consumers.runtime.watchdog import EXIT_STUCK
from consumers.telemetry.failed_start import EXIT_START_FAILED
from proving.chaos.app import hang_markers
from proving.keptlogs import TAIL_LINES, keep_log

log = structlog.get_logger(__name__)

TARGETS = {False: "proving.chaos.app:app", True: "proving.chaos.app:push_app"}
RELAY_COMMAND = ("proving.chaos.relay",)  # python -m ...


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))


@dataclass(slots=True, kw_only=True)
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    armed: CrashPoint | None = None
    sent: signal.Signals | None = None  # what the run sent this process, if anything
    starts: int = 0
    ready_at: float = 0.0  # no restart before this (monotonic)


@dataclass(slots=True, kw_only=True)
class FleetCounts:
    killed: int = 0  # SIGKILLs sent by the run
    terminated: int = 0  # SIGTERMs sent by the run
    unclean_terms: int = 0  # SIGTERMed processes that did not exit 0 (nor -15: see below)
    # SIGTERMed while still starting (its handler not yet installed, e.g. while
    # a service is down): the default action ends it, like a kill.
    terms_while_starting: int = 0
    crashed_at: Counter[str] = field(default_factory=Counter)  # crash point -> kills
    start_failures: int = 0
    starts: int = 0
    hangs: int = 0  # exits 70 of a process that hung on a planned hang job (its marker)
    unexpected_stuck: int = 0  # exits 70 no hang marker explains


class Fleet:
    def __init__(
        self,
        *,
        size: int,
        env: Mapping[str, str],
        log_dir: Path,
        crash_quota: Mapping[CrashPoint, int],
        max_crash_after: int,
        rng: random.Random,
        push: bool = False,
        spread_seconds: float = 0.0,
        slot_env: Sequence[Mapping[str, str]] = (),
        command: tuple[str, ...] | None = None,
        name: str = "worker",
        hang_dir: Path | None = None,
        on_killed: Callable[[int], None] | None = None,
    ) -> None:
        self.on_killed = on_killed  # told the pid of each process that died by SIGKILL
        self.hang_dir = hang_dir  # the hang jobs' markers (proving.chaos.app.first_hang)
        self.slot_env = list(slot_env)  # per slot, over `env` (a cluster's address order)
        self.spread_seconds = spread_seconds  # spread the crash quota over this long
        self._started = 0.0
        # what follows `python -m`: a worker of the chaos app unless told otherwise
        self.command = command or ("consumers", "run", TARGETS[push])
        self.name = name
        self.env = dict(env)
        self.log_dir = log_dir
        self.slots = [_Slot(index=n) for n in range(size)]
        self.quota = dict(crash_quota)
        self.max_crash_after = max_crash_after
        self.rng = rng
        self.counts = FleetCounts()
        self.kept_logs: list[Path] = []  # logs of workers that exited non-zero unasked
        self.arming = True
        self.running = False
        self._task: asyncio.Task[None] | None = None

    # -- life cycle ------------------------------------------------------

    def start(self) -> None:
        self.running = True
        self._started = time.monotonic()
        for slot in self.slots:
            self._spawn(slot)
        self._task = asyncio.create_task(self._supervise(), name="fleet-supervisor")

    async def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every process and wait; SIGKILL what outlives `grace`."""
        self.running = False
        if self._task is not None:
            self._task.cancel()
        # Only the processes running now: one that exited before was classified already.
        running = [s for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for slot in running:
            assert slot.proc is not None
            slot.proc.send_signal(signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + grace
        for slot in running:
            assert slot.proc is not None
            while slot.proc.poll() is None:
                if asyncio.get_running_loop().time() > deadline:
                    slot.proc.kill()
                await asyncio.sleep(0.05)
            if slot.proc.returncode == EXIT_STUCK:
                self._classify(slot, EXIT_STUCK)  # a hang, or a stuck worker: not a failed stop
            elif slot.proc.returncode not in (0, -signal.SIGTERM):
                self.counts.unclean_terms += 1  # the final SIGTERM counts like the others
                self._keep_log(slot, slot.proc.returncode, "SIGTERMed at the end, did not exit 0")

    def kill_now(self) -> None:
        self.running = False
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                slot.proc.wait()

    @property
    def pending_crashes(self) -> int:
        return sum(1 for s in self.slots if s.armed is not None)

    def alive(self) -> list[int]:
        return [s.index for s in self.slots if s.proc is not None and s.proc.poll() is None]

    # -- faults ----------------------------------------------------------

    def sigkill(self) -> bool:
        """SIGKILL one running worker, chosen at random (not one hanging: its watchdog ends it)."""
        hanging = self._hung_pids()
        alive = [n for n in self.alive() if self._pid(n) not in hanging]
        if not alive:
            return False
        slot = self.slots[self.rng.choice(alive)]
        assert slot.proc is not None
        slot.sent = signal.SIGKILL
        slot.proc.send_signal(signal.SIGKILL)
        self.counts.killed += 1
        return True

    async def rolling_sigterm(self, patience: float = 60.0) -> int:
        """SIGTERM each worker in turn, waiting for it to come back before the next."""
        done = 0
        for slot in self.slots:
            proc = slot.proc
            if proc is None or proc.poll() is not None:
                continue
            slot.sent = signal.SIGTERM
            proc.send_signal(signal.SIGTERM)
            self.counts.terminated += 1
            done += 1
            deadline = asyncio.get_running_loop().time() + patience
            # The supervisor replaces the process; poll for that (no event to wait on).
            while slot.proc is proc and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        return done

    async def disarm(self) -> None:
        """Stop arming new starts and replace armed processes with clean ones."""
        self.arming = False
        for slot in self.slots:
            if slot.armed is not None and slot.proc is not None and slot.proc.poll() is None:
                slot.sent = signal.SIGTERM
                slot.proc.send_signal(signal.SIGTERM)
                self.counts.terminated += 1

    # -- plumbing --------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        env = {**os.environ, **self.env}
        if slot.index < len(self.slot_env):
            env.update(self.slot_env[slot.index])
        slot.armed = self._draw_crash()
        if slot.armed is not None:
            env["PROVING_CRASH_AT"] = str(slot.armed)
            env["PROVING_CRASH_AFTER"] = str(self.rng.randint(0, self.max_crash_after))
        log_path = self.log_dir / f"{self.name}-{slot.index}.log"
        with log_path.open("ab") as out:
            slot.proc = subprocess.Popen(
                [sys.executable, "-m", *self.command],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                preexec_fn=_die_with_parent,
            )
        slot.sent = None
        slot.starts += 1
        self.counts.starts += 1

    def _draw_crash(self) -> CrashPoint | None:
        if not self.arming:
            return None
        # Due by now: the quota spread evenly over `spread_seconds`, so the
        # crashes do not all happen in the first minute.
        elapsed = time.monotonic() - self._started
        share = min(1.0, elapsed / self.spread_seconds) if self.spread_seconds else 1.0
        left = {
            point: min(n, int(n * share) + 1)
            - self.counts.crashed_at[str(point)]
            - self._armed(point)
            for point, n in self.quota.items()
        }
        candidates = [p for p, n in left.items() if n > 0]
        if not candidates or self.rng.random() < 0.2:
            return None
        return self.rng.choice(candidates)

    def _armed(self, point: CrashPoint) -> int:
        return sum(1 for s in self.slots if s.armed is point and s.proc and s.proc.poll() is None)

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        while self.running:
            for slot in self.slots:
                proc = slot.proc
                if proc is None or (code := proc.poll()) is None:
                    continue
                if slot.ready_at == 0.0:
                    if code == -signal.SIGKILL and self.on_killed is not None:
                        self.on_killed(proc.pid)  # by the run, or at its own crash point
                    delay = self._classify(slot, code)
                    slot.ready_at = loop.time() + delay
                if loop.time() >= slot.ready_at and self.running:
                    slot.ready_at = 0.0
                    self._spawn(slot)
            await asyncio.sleep(0.05)

    def _pid(self, index: int) -> int | None:
        proc = self.slots[index].proc
        return None if proc is None else proc.pid

    def _hung_pids(self) -> set[int]:
        return set(hang_markers(self.hang_dir).values()) if self.hang_dir else set()

    def _classify(self, slot: _Slot, code: int) -> float:
        """Record why the slot's process exited; return the delay before a restart."""
        if slot.sent is signal.SIGKILL:
            return 0.3
        if code == EXIT_STUCK:
            assert slot.proc is not None
            if slot.proc.pid in self._hung_pids():
                self.counts.hangs += 1  # its watchdog ended a planned hang
                return 0.1
            self.counts.unexpected_stuck += 1
            log.warning("worker_stuck_unplanned", slot=slot.index, code=code)
            self._keep_log(slot, code, "watchdog exit (70) with no planned hang")
            return 0.1
        if slot.sent is signal.SIGTERM and code != EXIT_START_FAILED:
            if code == -signal.SIGKILL and slot.armed is not None:
                # Its armed crash point fired in the batch it finished on the way out.
                self.counts.crashed_at[str(slot.armed)] += 1
            elif code == -signal.SIGTERM:
                self.counts.terms_while_starting += 1
            elif code != 0:
                self.counts.unclean_terms += 1
                log.warning("worker_unclean_sigterm", slot=slot.index, code=code)
                self._keep_log(slot, code, "SIGTERMed, did not exit 0")
            return 0.1
        if code == -signal.SIGKILL and slot.armed is not None:
            self.counts.crashed_at[str(slot.armed)] += 1
            return 0.3
        # A start that failed (EXIT_START_FAILED) counts here even when a SIGTERM
        # crossed it: the process did not fail to stop, it failed to start.
        self.counts.start_failures += 1
        log.info("worker_exited", slot=slot.index, code=code)
        # Expected while a service is down: kept, but its last line only is printed.
        self._keep_log(slot, code, "exited by itself", tail=1)
        return 1.0

    def _keep_log(self, slot: _Slot, code: int, why: str, *, tail: int = TAIL_LINES) -> None:
        """Copy the slot's log out of the run directory, which goes when the run ends."""
        run = self.log_dir.parent.name
        # The slot's own log: a relay fleet's slot 0 is relay-0.log, not the worker's.
        name = f"{run}-{self.name}-{slot.index}-start{slot.starts}-exit{code}.log"
        source = self.log_dir / f"{self.name}-{slot.index}.log"
        self.kept_logs.append(keep_log(source, name, why, tail=tail))
