"""A local RabbitMQ cluster on free ports, for tests and the chaos run.

    async with LocalCluster(workdir) as cluster:   # 3 nodes unless told
        cluster.urls                                # one AMQP URL per node
        node = await cluster.leader("orders")       # who leads a quorum queue
        await node.stop(crash=True)                 # SIGKILL of its VM
        await node.start()                          # back, rejoins on its own

Node i is `iwcluster-<pid>-<i>@localhost` with its own AMQP and
distribution ports and its own directory under `workdir`; all share one
Erlang cookie (and the machine's epmd). Node 0 boots first; the others join
it on their first boot (classic-config peer discovery naming every node), so
no `join_cluster` round is needed; `start()` checks that all nodes are
running in one cluster before it returns.

Every node is a direct child (the Popen pid is the Erlang VM's) with a
parent-death SIGKILL; `__aexit__` kills them all and removes `workdir`, also
when the body raised. Nodes whose run died without them (the pid in their
name is gone) are killed before a start; other live runs keep theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from proving.chaos.rabbitmqctl import PATIENCE_S, ClusterCommandError, queue_state, rabbitmqctl
from proving.chaos.services import PrivateRabbit, ServiceError, free_port, remove_tree

NODE_PREFIX = "iwcluster-"
# How long a node's queues may take to have their leader and every member online again.
ONLINE_PATIENCE_S = 120.0


def _owner_alive(node: str) -> bool:
    """Whether the run named in `iwcluster-<pid>-<i>@host` is still running."""
    pid = node.removeprefix(NODE_PREFIX).split("-", 1)[0]
    if not pid.isdigit():
        return True  # not one of ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_leftover_nodes() -> int:
    """SIGKILL Erlang VMs of our nodes whose run is gone; return how many.

    Nodes die with their run (a parent-death signal); this catches the rest.
    A node of a run still alive (another test, a chaos run) is left alone.
    """
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        # The VM's argv does not carry the node name; its environment does.
        names = [
            e.decode(errors="replace").partition("=")[2]
            for e in environ
            if e.startswith(b"RABBITMQ_NODENAME=")
        ]
        if any(n.startswith(NODE_PREFIX) and not _owner_alive(n) for n in names):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


class LocalCluster:
    """`size` RabbitMQ nodes on this machine, one cluster."""

    def __init__(self, workdir: Path, *, size: int = 3) -> None:
        self.workdir = workdir
        self.cookie = secrets.token_hex(16)
        names = [f"{NODE_PREFIX}{os.getpid()}-{i}@localhost" for i in range(size)]
        discovery = "cluster_formation.peer_discovery_backend = classic_config\n" + "".join(
            f"cluster_formation.classic_config.nodes.{i + 1} = {name}\n"
            for i, name in enumerate(names)
        )
        self.nodes = [
            PrivateRabbit(
                workdir / f"node{i}",
                free_port(),
                free_port(),
                node=name,
                cookie=self.cookie,
                config=discovery,
            )
            for i, name in enumerate(names)
        ]
        self.home = workdir / "cli"  # the CLI tools' HOME: the same cookie
        self.home.mkdir(parents=True, exist_ok=True)
        cookie_file = self.home / ".erlang.cookie"
        cookie_file.write_text(self.cookie)
        cookie_file.chmod(0o400)

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node_named(self, name: str) -> PrivateRabbit:
        return next(node for node in self.nodes if node.node == name)

    def running(self) -> list[PrivateRabbit]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    # -- life cycle ------------------------------------------------------

    async def start(self) -> None:
        kill_leftover_nodes()
        first, *others = self.nodes
        await first.start()
        await asyncio.gather(*(node.start() for node in others))
        await self.wait_formed()

    async def wait_formed(self, patience: float = 120.0) -> None:
        """Until every node reports all nodes running in its cluster."""
        names = sorted(n.node for n in self.nodes)
        deadline = asyncio.get_running_loop().time() + patience
        while True:
            try:
                status = await self.ctl("cluster_status", "--formatter", "json", node=self.nodes[0])
                running = sorted(json.loads(status).get("running_nodes", []))
                if running == names:
                    return
            except ClusterCommandError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise ServiceError(f"cluster of {names} not formed within {patience} s")
            await asyncio.sleep(1.0)

    def kill_now(self) -> None:
        for node in self.nodes:
            node.kill_now()

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

    # -- asking the cluster ---------------------------------------------

    async def ctl(
        self,
        *args: str,
        node: PrivateRabbit | None = None,
        tool: str = "rabbitmqctl",
        patience: float = PATIENCE_S,
    ) -> str:
        """`tool -n NODE args...`'s output; NODE: `node`, or the first running one."""
        target = node or (self.running() or self.nodes)[0]
        return await rabbitmqctl(target.node, self.home, *args, tool=tool, patience=patience)

    async def state(self) -> list[str]:
        """The nodes up (as their processes and the cluster see them), and every queue's."""
        up = [n.node for n in self.running()]
        lines = [f"nodes running (processes): {' '.join(up) or 'none'}"]
        try:
            status = json.loads(
                await self.ctl("cluster_status", "--formatter", "json", patience=10)
            )
            lines.append(f"nodes running (cluster): {' '.join(status.get('running_nodes', []))}")
            lines += await queue_state(self.running()[0].node, self.home)
        except (ClusterCommandError, json.JSONDecodeError, IndexError) as exc:
            lines.append(f"cluster state: {exc}")
        return lines

    async def queues(self, names: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
        """name -> {leader, members, online} of the quorum queues, asked of a running node."""
        error: Exception | None = None
        for node in self.running():
            try:
                out = await self.ctl(
                    "list_queues",
                    "name",
                    "leader",
                    "members",
                    "online",
                    "--formatter",
                    "json",
                    node=node,
                )
            except ClusterCommandError as exc:
                error = exc
                continue
            rows = json.loads(out or "[]")
            return {r["name"]: r for r in rows if not names or r["name"] in names}
        raise ClusterCommandError(f"no running node answered: {error}")

    async def leader(self, queue: str) -> PrivateRabbit | None:
        """The node leading `queue` now, or None while it has no leader."""
        row = (await self.queues([queue])).get(queue)
        leader = row.get("leader") if row else None
        if not isinstance(leader, str) or leader not in {n.node for n in self.nodes}:
            return None
        return self.node_named(leader)

    async def wait_online(self, queues: Sequence[str], patience: float = ONLINE_PATIENCE_S) -> None:
        """Until each of `queues` has a leader and every node online as a member."""
        deadline = asyncio.get_running_loop().time() + patience
        want = len(self.nodes)
        while True:
            with contextlib.suppress(ClusterCommandError, json.JSONDecodeError):
                rows = await self.queues(queues)
                if len(rows) == len(queues) and all(
                    isinstance(r.get("leader"), str)
                    and r["leader"]
                    and len(r.get("online") or []) == want
                    for r in rows.values()
                ):
                    return
            if asyncio.get_running_loop().time() > deadline:
                raise ServiceError(f"{list(queues)} not online on {want} nodes in {patience} s")
            await asyncio.sleep(1.0)
