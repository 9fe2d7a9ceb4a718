"""Private RabbitMQ and PostgreSQL for the chaos run, restarted freely.

The chaos run never touches the machine's shared broker and database: it
starts its own RabbitMQ node (`chaos-<pid>@localhost`) and its own PostgreSQL
cluster on other ports, with all their state in one temporary directory, and
crashes and restarts those. Both run as direct children (the Popen pid is the
Erlang VM's or the postmaster's pid), so a hard crash is one signal:

    RabbitMQ    stop: SIGTERM (a clean shutdown)     crash: SIGKILL of the VM
    PostgreSQL  stop: SIGINT (fast)                  crash: SIGQUIT (immediate mode)

Each child gets a parent-death signal, so even a SIGKILLed chaos run leaves
no private service behind; `close()` (called from a `finally`) removes them
and their directory in the ordinary case.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from proving.chaos.rabbitmqctl import ClusterCommandError, queue_state

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
START_PATIENCE_S = 60.0  # a start that is not up by then fails
STOP_PATIENCE_S = 60.0  # a stop that has not ended by then SIGKILLs
RECOVERY_S = STOP_PATIENCE_S + START_PATIENCE_S  # the longest a restart may take
PG_BIN = Path("/usr/lib/postgresql/15/bin")
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServiceError(Exception):
    """A private service did not start."""


def _dies_with_parent(sig: signal.Signals) -> Callable[[], None]:
    def arm() -> None:  # runs in the child between fork and exec
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))

    return arm


async def _port_open(port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 5)
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class _Child:
    argv: list[str]
    env: Mapping[str, str]
    log: Path
    user: str | None
    death_signal: signal.Signals

    def spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                self.argv,
                env=dict(self.env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                user=self.user,
                group=self.user,
                start_new_session=True,  # a terminal's Ctrl-C reaches the run, not the service
                preexec_fn=_dies_with_parent(self.death_signal),
            )


class _Service:
    """A child process listening on `port`, with stop, crash and restart."""

    name = "service"
    stop_signal = signal.SIGTERM
    crash_signal = signal.SIGKILL
    start_timeout = START_PATIENCE_S

    def __init__(self, child: _Child, port: int) -> None:
        self.child = child
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.proc = self.child.spawn()
        deadline = asyncio.get_running_loop().time() + self.start_timeout
        while not await self._ready():
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with {self.proc.returncode}; see {self.child.log}"
                )
            if asyncio.get_running_loop().time() > deadline:
                raise ServiceError(f"{self.name} not up after {self.start_timeout} s")
            await asyncio.sleep(0.1)

    async def _ready(self) -> bool:
        return await _port_open(self.port)

    async def stop(self, *, crash: bool = False, patience: float = STOP_PATIENCE_S) -> None:
        """Stop cleanly, or crash (`crash=True`); wait until the process is gone."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(self.crash_signal if crash else self.stop_signal)
        deadline = asyncio.get_running_loop().time() + patience
        while proc.poll() is None:
            if asyncio.get_running_loop().time() > deadline:
                proc.kill()
            await asyncio.sleep(0.05)

    async def restart(self, *, crash: bool) -> None:
        await self.stop(crash=crash)
        await self.start()

    def kill_now(self) -> None:
        """Synchronous last resort for teardown paths."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# A quorum queue's at-least-once dead-lettering (our retry tiers) republishes a
# message whose confirm did not come after this long; 3.10's default is 180 s,
# so a tier whose target queue lost its leader mid-move, or whose node was
# restarted, held its messages for minutes (seen in the cluster profile: a
# poison job dead-lettered 144 s after publish instead of 10). Every private
# node, single or clustered, gets 10 s.
DLX_CONFIRM_TIMEOUT_MS = 10_000
ADVANCED = (
    f"[{{rabbit, [{{dead_letter_worker_publisher_confirm_timeout, {DLX_CONFIRM_TIMEOUT_MS}}}]}}]."
)


class PrivateRabbit(_Service):
    name = "rabbitmq"

    def __init__(
        self,
        base: Path,
        port: int,
        dist_port: int,
        *,
        node: str | None = None,
        cookie: str | None = None,
        config: str = "",
        advanced: str = ADVANCED,
    ) -> None:
        """One node; a cluster's nodes share `cookie` and name each other in `config`.

        `advanced` is the node's advanced.config (Erlang terms), for settings
        rabbitmq.conf has no key for.
        """
        base.mkdir(parents=True, exist_ok=True)
        node = node or f"chaos{os.getpid()}@localhost"
        if cookie is not None:  # HOME is `base`: the Erlang cookie is read from there
            cookie_file = base / ".erlang.cookie"
            cookie_file.write_text(cookie)
            cookie_file.chmod(0o400)
        (base / "enabled_plugins").write_text("[].\n")
        (base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{port}\n"
            "loopback_users = none\n"
            "log.console = false\n"
            "log.file.level = warning\n" + config
        )
        (base / "rabbitmq-env.conf").write_text("")
        (base / "advanced.config").write_text(advanced + "\n")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(base),  # a private Erlang cookie
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": node,
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(base / "plugins-expand"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            # Run the VM in place of the script: the Popen pid is the broker's.
            "RUNNING_UNDER_SYSTEMD": "1",
        }
        super().__init__(
            _Child(
                argv=[RABBITMQ_SERVER],
                env=env,
                log=base / "rabbitmq.out",
                user=None,
                death_signal=signal.SIGKILL,
            ),
            port,
        )
        self.node = node
        self.home = base
        self.url = f"amqp://guest:guest@127.0.0.1:{port}/"

    async def state(self) -> list[str]:
        """Whether the node runs, and its queues' ready / unacked / consumers."""
        if self.proc is None or self.proc.poll() is not None:
            return [f"node {self.node}: not running"]
        try:
            return [f"node {self.node}: running", *await queue_state(self.node, self.home)]
        except ClusterCommandError as exc:
            return [f"node {self.node}: running; queues: {exc}"]

    async def _ready(self) -> bool:
        # The AMQP listener opens last, once the boot steps (and recovery) are done.
        return await _port_open(self.port)


class PrivatePostgres(_Service):
    name = "postgresql"
    stop_signal = signal.SIGINT  # fast shutdown
    crash_signal = signal.SIGQUIT  # immediate shutdown: crash recovery on the next start
    user = "postgres"

    def __init__(self, base: Path, port: int, *, settings: Mapping[str, str] | None = None) -> None:
        """One server; `settings` go on its command line (`-c name=value`)."""
        self.base = base
        self.data = base / "data"
        self.sockets = base / "sockets"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        super().__init__(
            _Child(
                argv=[
                    str(PG_BIN / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(port),
                    "-k",
                    str(self.sockets),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "max_connections=200",
                    "-c",
                    "shared_buffers=64MB",
                    "-c",
                    "log_min_messages=warning",
                    *(f"-c{name}={value}" for name, value in (settings or {}).items()),
                ],
                env=env,
                log=base / "postgres.out",
                user=self._os_user(),
                death_signal=signal.SIGQUIT,
            ),
            port,
        )
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    async def state(self) -> list[str]:
        running = self.proc is not None and self.proc.poll() is None
        ready = running and await asyncio.wait_for(self._ready(), 10)
        return [
            f"postgresql :{self.port}: {'ready' if ready else 'running' if running else 'down'}"
        ]

    def _os_user(self) -> str | None:
        # initdb and postgres refuse to run as root.
        return self.user if os.geteuid() == 0 else None

    def init(self) -> None:
        """initdb into the private directory (trust auth on the private port)."""
        user = self._os_user()
        self.base.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (self.base, self.sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--no-instructions",
            ],
            check=True,
            user=user,
            group=user,
            env=dict(self.child.env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    async def _ready(self) -> bool:
        if not await _port_open(self.port):
            return False
        # The port opens before recovery finishes: ask pg_isready.
        check = await asyncio.create_subprocess_exec(
            str(PG_BIN / "pg_isready"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-q",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return await asyncio.wait_for(check.wait(), 10) == 0  # pg_isready gives up in 3 s


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
