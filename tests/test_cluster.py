"""A real 3-node cluster: a worker whose node dies moves on; the chaos cluster profile."""

from __future__ import annotations

import re
import sys

import pytest

from consumers import Publisher
from dedupe import DbConnection
from proving.chaos.cluster import LocalCluster
from tests.conftest import Spawn
from tests.support import run_to_end, wait_consumers, wait_for

LINE = re.compile(r"^cluster: nodes=\d+ .*$", re.MULTILINE)


async def _effects(db: DbConnection) -> int:
    count: int = await db.fetchval("SELECT count(DISTINCT message_id) FROM effects")
    return count


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_worker_whose_node_is_killed_moves_on_and_applies_each_effect_once(
    db: DbConnection, queue_name: str, local_cluster: LocalCluster, spawn: Spawn
) -> None:
    first, other, _ = local_cluster.nodes
    worker = spawn({"AMQP_URL": ",".join(local_cluster.urls)})  # node 0 first
    await wait_consumers(other.url, queue_name, 1, timeout=90)
    publisher, connection = await Publisher.connect(other.url)
    try:
        for n in range(100):
            await publisher.publish(queue_name, {"n": n}, message_id=f"before-{n}")
        await wait_for(lambda: _at_least(db, 100), timeout=90)
        await first.stop(crash=True)  # the worker's node: SIGKILL of its VM
        for n in range(100):
            await publisher.publish(queue_name, {"n": n}, message_id=f"after-{n}")
        await wait_for(lambda: _at_least(db, 200), timeout=120)
    finally:
        await connection.close()
    rows = await db.fetch("SELECT message_id, count(*) AS n FROM effects GROUP BY message_id")
    assert len(rows) == 200
    assert all(row["n"] == 1 for row in rows)
    moved = [line for line in worker.log_text().splitlines() if "amqp_address_moved" in line]
    assert moved and f":{first.port}/" in moved[0], worker.log_text()[-3000:]


async def _at_least(db: DbConnection, n: int) -> bool:
    return await _effects(db) >= n


def _figures(line: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_cluster_ci_profile_survives_leader_kills_and_a_rolling_restart() -> None:
    run = run_to_end(
        [sys.executable, "-m", "consumers", "chaos", "--profile", "cluster-ci"], timeout=780
    )
    found = LINE.findall(run.stdout)
    assert found, f"no summary line\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    figures = _figures(found[-1])
    assert (figures["lost"], figures["doubled"], figures["stuck"]) == (0, 0, 0), run.stdout
    assert figures["nodes"] == 3, run.stdout
    assert figures["leader_kills"] >= 3 and figures["rolling_restarts"] >= 1, run.stdout
    assert figures["failovers"] >= 1, run.stdout
    assert run.returncode == 0, run.stdout[-3000:]
