"""Said at start: a primary with a standby whose commits do not wait for it.

A real primary and streaming standby (`proving.chaos.replicas`). Commits that
wait for the standby: nothing said. Commits that do not (the primary's
`synchronous_standby_names` emptied): one warning line; with
IW_REQUIRE_SYNC_REPLICATION=1, a refused start, exit 78.
"""

from __future__ import annotations

import pytest

from proving.chaos.replicas import StandbyPair
from tests.conftest import Spawn
from tests.test_sync_replication import prepare_effects

WARNING = "database_commits_not_replicated"


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_worker_says_at_start_when_commits_do_not_wait_for_the_standby(
    standby_pair: StandbyPair, schema: str, spawn: Spawn
) -> None:
    pair = standby_pair
    await prepare_effects(pair.primary.url, schema)
    waiting = spawn({"DATABASE_URL": pair.dsn})
    await waiting.wait_logged("worker_started")
    assert not waiting.events(WARNING)

    await pair.primary.stop()  # back without synchronous_standby_names: its default, empty
    pair.primary.child.argv[:] = [
        a for a in pair.primary.child.argv if not a.startswith("-csynchronous_standby_names")
    ]
    await pair.primary.start()
    await pair.wait_streaming(synchronous=False)
    warned = spawn({"DATABASE_URL": pair.dsn})
    await warned.wait_logged("worker_started")
    [line] = warned.events(WARNING)
    assert line["standbys"] == 1 and line["synchronous_standby_names"] == ""

    refused = spawn({"DATABASE_URL": pair.dsn, "IW_REQUIRE_SYNC_REPLICATION": "1"})
    await refused.expect_exit(78)
    [failed] = refused.events("start_failed")
    assert failed["error"] == "commits_not_replicated"
