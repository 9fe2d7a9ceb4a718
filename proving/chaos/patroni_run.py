"""One command against a Patroni cluster of its own: its `DATABASE_URL` is the cluster's.

    python -m proving.chaos.patroni_run [--async] [--timeout S] -- COMMAND [ARG...]

1. Start a Patroni cluster of 3 nodes (proving.chaos.patroni), synchronous
   replication unless `--async` (`synchronous_mode` off and
   `synchronous_commit = local`: commits wait for no standby).
2. Run COMMAND with `DATABASE_URL` set to the cluster's multi-host DSN
   (`target_session_attrs=read-write`), its output passed through; past
   `--timeout` it is SIGTERMed, then SIGKILLed.
3. Kill the cluster and remove its directory, whatever happened; exit with
   COMMAND's code.

What the standby's round trip costs a batch is the same bench run twice:

    python -m proving.chaos.patroni_run -- idempotent-workers bench --variants framework
    python -m proving.chaos.patroni_run --async -- idempotent-workers bench --variants framework
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from proving.chaos.patroni import PatroniCluster, new_workdir
from proving.chaos.run import say
from proving.chaos.services import remove_tree

GRACE_S = 30.0  # after SIGTERM, before SIGKILL


async def run_on_cluster(command: Sequence[str], *, synchronous: bool, patience: float) -> int:
    """Steps 1 to 3 above; COMMAND's exit code."""
    workdir = new_workdir()
    (workdir / "pg").mkdir()
    (workdir / "pg").chmod(0o755)
    try:
        async with PatroniCluster(workdir / "pg", synchronous=synchronous) as cluster:  # 1.
            mode = "synchronous" if synchronous else "asynchronous (synchronous_commit = local)"
            say(f"patroni cluster of 3 nodes up, {mode}: {cluster.dsn}")
            return await _to_end(command, {**os.environ, "DATABASE_URL": cluster.dsn}, patience)
    finally:
        remove_tree(workdir)  # 3. the cluster's exit killed it and removed workdir/pg


async def _to_end(command: Sequence[str], env: dict[str, str], patience: float) -> int:
    """2. COMMAND to its end; SIGTERM past `patience`, SIGKILL past the grace after."""
    child = await asyncio.create_subprocess_exec(*command, env=env)
    try:
        return await asyncio.wait_for(child.wait(), patience)
    except TimeoutError:
        say(f"{command[0]} did not end within {patience:.0f} s: SIGTERM")
        child.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(child.wait(), GRACE_S)
        except TimeoutError:
            child.kill()
            await asyncio.wait_for(child.wait(), GRACE_S)
        return 124


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proving.chaos.patroni_run", description=__doc__
    )
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds COMMAND may take")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND after --")
    return asyncio.run(
        run_on_cluster(command, synchronous=not args.asynchronous, patience=args.timeout)
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
