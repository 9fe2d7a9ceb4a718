"""The RabbitMQ command-line tools against one private node, each call bounded.

    out = await rabbitmqctl(node, home, "cluster_status", "--formatter", "json")
    lines = await queue_state(node, home)    # "name ready=.. unacked=.. consumers=.." each

`home` holds the node's Erlang cookie (the tools read `$HOME/.erlang.cookie`):
a single private node writes its own there on first boot, a cluster's
nodes share one (`proving.chaos.cluster`). A call that does not answer
within `patience` is killed and raises `ClusterCommandError`, as does one
that exits non-zero.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

SBIN = Path("/usr/lib/rabbitmq/bin")
# Long enough for a node busy recovering its queues; a hung node fails the call.
PATIENCE_S = 60.0


class ClusterCommandError(Exception):
    """A rabbitmqctl or rabbitmq-queues call failed or did not answer."""


async def rabbitmqctl(
    node: str,
    home: Path,
    *args: str,
    tool: str = "rabbitmqctl",
    patience: float = PATIENCE_S,
) -> str:
    """`tool -n node -q args...`'s output."""
    proc = await asyncio.create_subprocess_exec(
        str(SBIN / tool),
        "-n",
        node,
        "-q",
        *args,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "LANG": "C.UTF-8",
        },
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), patience)
    except TimeoutError:
        proc.kill()
        await asyncio.wait_for(proc.wait(), patience)  # a SIGKILLed child ends at once
        raise ClusterCommandError(
            f"{tool} -n {node} {' '.join(args)}: no answer in {patience:.0f} s"
        ) from None
    if proc.returncode != 0:
        raise ClusterCommandError(
            f"{tool} -n {node} {' '.join(args)}: {err.decode(errors='replace').strip()}"
        )
    return out.decode()


async def queue_state(node: str, home: Path, *, patience: float = 10.0) -> list[str]:
    """One line per queue: its messages ready and unacknowledged, its consumers, its leader."""
    out = await rabbitmqctl(
        node,
        home,
        "list_queues",
        "name",
        "messages_ready",
        "messages_unacknowledged",
        "consumers",
        "leader",
        "--formatter",
        "json",
        patience=patience,
    )
    return [
        f"queue {row.get('name')} ready={row.get('messages_ready')}"
        f" unacked={row.get('messages_unacknowledged')} consumers={row.get('consumers')}"
        f" leader={row.get('leader', '')}"
        for row in json.loads(out or "[]")
    ]
