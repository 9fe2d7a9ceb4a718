"""`idempotent-workers run MODULE:APP --processes N`: N worker processes under one supervisor.

The supervisor never touches a message; correctness stays with each worker
(claims, commit before ack). What it promises, in the order `Supervisor.run`
does it:

1. a PROMETHEUS_MULTIPROC_DIR for the children: the one in the environment
   (emptied first) or a fresh temporary one (removed at exit). With
   IW_METRICS_PORT set, the supervisor serves /metrics (the children's
   values added up), /healthz and /readyz there (`consumers.telemetry.multiproc`);
2. N children, each `python -m consumers run MODULE:APP --app-dir DIR` (the
   folder made absolute), with the same environment but no port of their
   own. They inherit stdout and stderr: a child's last lines before it dies
   stay in the supervisor's log;
3. SIGTERM or SIGINT: forwarded to every child, which stops consuming,
   commits and acks what it holds, and exits; the supervisor waits for each
   (its grace, IW_SHUTDOWN_GRACE, plus a margin, then SIGKILL: what is left
   unacked is redelivered). Exit 0 when every child exited cleanly;
4. a child that exits unasked is reaped (its live gauges dropped) and started
   again after a backoff that doubles with each recent death; more than
   `max_restarts` deaths within `window_seconds` and the supervisor stops
   the others and exits 1: something is wrong that restarting will not fix;
5. a child that exits EXIT_CONFIG (78: its configuration was refused, a
   queue exists with other arguments) is not restarted: the supervisor stops
   the others and exits 78 itself, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import structlog

from consumers.settings import Settings
from consumers.telemetry.endpoint import Endpoint
from consumers.telemetry.failed_start import EXIT_CONFIG
from consumers.telemetry.health import BEAT_SECONDS
from consumers.telemetry.metrics import DedupeCollector
from consumers.telemetry.multiproc import (
    ChildrenHealth,
    SupervisorCollector,
    children_registry,
    mark_dead,
    prepare,
)
from dedupe import TableStats, table_stats

log = structlog.get_logger(__name__)

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
STOP_MARGIN_SECONDS = 15.0  # past a child's own grace, before it is SIGKILLed
SCRAPE_READ_SECONDS = 3.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartPolicy:
    max_restarts: int = 5  # deaths tolerated within the window; one more and we give up
    window_seconds: float = 60.0
    first_backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0

    def backoff(self, recent_deaths: int) -> float:
        doubled = self.first_backoff_seconds * 2.0 ** (recent_deaths - 1)
        return min(self.max_backoff_seconds, doubled)


@dataclass(slots=True)
class _Child:
    index: int
    proc: asyncio.subprocess.Process
    started: float = field(default_factory=time.monotonic)
    asked_to_stop: bool = False


class Supervisor:
    def __init__(
        self,
        target: str,
        processes: int,
        settings: Settings,
        *,
        policy: RestartPolicy | None = None,
        log_level: str = "info",
        app_dir: str = ".",
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be at least 1")
        self.target = target
        self.processes = processes
        self.settings = settings
        self.policy = policy or RestartPolicy()
        self.log_level = log_level
        self.app_dir = str(Path(app_dir).resolve())  # the children's, whatever their cwd
        self._children: dict[int, _Child] = {}
        self._exits: asyncio.Queue[tuple[_Child, int]] = asyncio.Queue()
        self._deaths: list[float] = []  # monotonic times of unasked exits
        self._restarts = 0
        self._restarting: set[asyncio.Task[None]] = set()
        self._watching: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._beat = time.time()
        self._db: asyncpg.Connection | None = None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        directory, owned = _metrics_directory()
        endpoint = self._serve(directory, loop) if self.settings.metrics.port is not None else None
        beating = asyncio.create_task(self._beat_forever())
        log.info(
            "supervisor_started",
            target=self.target,
            processes=self.processes,
            pid=os.getpid(),
            metrics_dir=str(directory),
        )
        try:
            for index in range(self.processes):
                await self._spawn(index, directory)
            code = await self._supervise(directory)
            code = max(code, await self._stop_children(directory))
        finally:
            beating.cancel()
            if endpoint is not None:
                endpoint.close()
            if self._db is not None:
                await self._db.close()
            if owned:
                shutil.rmtree(directory, ignore_errors=True)
        log.info("supervisor_stopped", exit_code=code, restarts=self._restarts)
        return code

    async def _supervise(self, directory: Path) -> int:
        """Reap and restart children until a stop is asked for (0), they keep dying (1)
        or one's configuration was refused (78)."""
        stopping = asyncio.create_task(self._stop.wait())
        try:
            while True:
                exited = asyncio.create_task(self._exits.get())
                done, _ = await asyncio.wait(
                    {exited, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                if exited not in done:
                    exited.cancel()
                    return 0
                child, code = exited.result()
                self._reap(child, code, directory)
                if code == EXIT_CONFIG:  # the same start would be refused again
                    log.error("process_config_refused", index=child.index, exit_code=code)
                    return EXIT_CONFIG
                now = time.monotonic()
                self._deaths = [t for t in self._deaths if now - t < self.policy.window_seconds]
                self._deaths.append(now)
                if len(self._deaths) > self.policy.max_restarts:
                    log.error(
                        "processes_keep_dying",
                        deaths=len(self._deaths),
                        window_s=self.policy.window_seconds,
                        last_exit_code=code,
                    )
                    return 1
                delay = self.policy.backoff(len(self._deaths))
                log.warning("process_restart_scheduled", index=child.index, delay_s=delay)
                task = asyncio.create_task(self._restart(child.index, delay, directory))
                self._restarting.add(task)
                task.add_done_callback(self._restarting.discard)
        finally:
            stopping.cancel()

    async def _restart(self, index: int, delay: float, directory: Path) -> None:
        await asyncio.sleep(delay)
        if not self._stop.is_set():
            self._restarts += 1
            await self._spawn(index, directory)

    async def _spawn(self, index: int, directory: Path) -> None:
        env = {**os.environ, MULTIPROC_DIR: str(directory)}
        env.pop("IW_METRICS_PORT", None)  # the supervisor serves; children write files
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "consumers",
            "--log-level",
            self.log_level,
            "run",
            self.target,
            "--app-dir",
            self.app_dir,
            env=env,
            preexec_fn=_stops_with_parent,
        )
        child = _Child(index=index, proc=proc)
        self._children[index] = child
        log.info("process_started", index=index, pid=proc.pid)
        watch = asyncio.create_task(self._watch(child))
        self._watching.add(watch)
        watch.add_done_callback(self._watching.discard)

    async def _watch(self, child: _Child) -> None:
        code = await child.proc.wait()
        if not child.asked_to_stop:
            await self._exits.put((child, code))

    def _reap(self, child: _Child, code: int, directory: Path) -> None:
        if self._children.get(child.index) is child:
            del self._children[child.index]
        mark_dead(directory, child.proc.pid)
        log.warning(
            "process_exited",
            index=child.index,
            pid=child.proc.pid,
            exit_code=code,
            ran_s=round(time.monotonic() - child.started, 1),
            asked=False,
        )

    async def _stop_children(self, directory: Path) -> int:
        """SIGTERM every child, wait for its drain; 0 if every one exited cleanly."""
        for task in list(self._restarting):
            task.cancel()
        children = list(self._children.values())
        log.info("supervisor_stopping", children=[c.proc.pid for c in children])
        for child in children:
            child.asked_to_stop = True
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        codes = await asyncio.gather(*(self._drained(c) for c in children))
        for child, code in zip(children, codes, strict=True):
            mark_dead(directory, child.proc.pid)
            log.info(
                "process_exited", index=child.index, pid=child.proc.pid, exit_code=code, asked=True
            )
        # A child still importing when the signal came dies of it: it held nothing.
        clean = all(code in (0, -signal.SIGTERM) for code in codes)
        return 0 if clean else 1

    async def _drained(self, child: _Child) -> int:
        grace = self.settings.worker.shutdown_grace_seconds + STOP_MARGIN_SECONDS
        try:
            return await asyncio.wait_for(child.proc.wait(), grace)
        except TimeoutError:
            log.error("process_stop_timeout", index=child.index, pid=child.proc.pid, waited_s=grace)
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
            return await child.proc.wait()

    # -- the endpoint -------------------------------------------------------

    async def _beat_forever(self) -> None:
        while True:
            self._beat = time.time()
            await asyncio.sleep(BEAT_SECONDS)

    def _serve(self, directory: Path, loop: asyncio.AbstractEventLoop) -> Endpoint:
        def read() -> TableStats | None:
            future = asyncio.run_coroutine_threadsafe(self._table_stats(), loop)
            try:
                return future.result(timeout=SCRAPE_READ_SECONDS)
            except TimeoutError:
                future.cancel()
                return None

        def running() -> int:
            return sum(1 for c in self._children.values() if c.proc.returncode is None)

        registry = children_registry(
            directory,
            DedupeCollector(read),
            SupervisorCollector(restarts=lambda: self._restarts, running=running),
        )
        health = ChildrenHealth(
            directory, expected=self.processes, running=running, own_beat=lambda: self._beat
        )
        metrics = self.settings.metrics
        assert metrics.port is not None
        return Endpoint(registry, health, host=metrics.host, port=metrics.port).start()

    async def _table_stats(self) -> TableStats:
        """Read in the supervisor's loop, on a connection of its own (reopened after a failure)."""
        if self._db is None or self._db.is_closed():
            self._db = await asyncpg.connect(self.settings.database.url)
        try:
            return await table_stats(self._db, self.settings.database.schema)
        except Exception:
            with contextlib.suppress(Exception):
                await self._db.close()
            self._db = None
            raise


def _metrics_directory() -> tuple[Path, bool]:
    """(the children's PROMETHEUS_MULTIPROC_DIR, whether it is ours to remove)."""
    given = os.environ.get(MULTIPROC_DIR)
    if given:
        directory = Path(given)
        prepare(directory)
        return directory, False
    return Path(tempfile.mkdtemp(prefix="idempotent-workers-metrics-")), True


# Loaded here, not between fork and exec, where loading a library could wait
# on a lock another thread (the endpoint's) held at the fork.
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform == "linux" else None


def _stops_with_parent() -> None:
    """In the child, between fork and exec: SIGTERM it (a clean drain) if the supervisor dies."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
