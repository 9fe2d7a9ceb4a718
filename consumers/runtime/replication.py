"""Said at start: a primary with standbys whose commits wait for none of them.

There an ack follows a commit only the primary has, and a failover to a
standby loses it (`dedupe.replication`). The worker reads the primary's
settings once it has its pool:

- standbys present and commits not waiting (`synchronous_standby_names`
  empty, or `synchronous_commit` local or off for our sessions): one warning
  line, `database_commits_not_replicated`, and the gauge
  `idempotent_workers_database_commits_unreplicated` at 1;
- with `IW_REQUIRE_SYNC_REPLICATION=1` the start is refused instead: one
  `start_failed` line and exit 78 (a restart cannot cure a setting).

No standby at all is a single server: nothing to fail over to, nothing said.
"""

from __future__ import annotations

import structlog

from consumers.message.decisions import ConfigurationError
from consumers.settings import DatabaseSettings
from consumers.telemetry.metrics import Metrics
from dedupe import DbConnection, ReplicationState, read_replication

log = structlog.get_logger(__name__)


class ReplicationRefused(ConfigurationError):
    """IW_REQUIRE_SYNC_REPLICATION is set and the primary's commits do not wait for a standby."""

    def __init__(self, state: ReplicationState) -> None:
        super().__init__(
            f"{state.standbys} standby(s), but commits do not wait for one"
            f" (synchronous_standby_names={state.synchronous_standby_names!r},"
            f" synchronous_commit={state.synchronous_commit!r})"
        )
        self.state = state


async def check_replication(
    conn: DbConnection, settings: DatabaseSettings, metrics: Metrics
) -> ReplicationState:
    """Read, publish and judge the primary's replication settings."""
    state = await read_replication(conn)
    metrics.commits_unreplicated.set(1 if state.unprotected else 0)
    if state.unprotected:
        if settings.require_synchronous_replication:
            raise ReplicationRefused(state)
        log.warning(
            "database_commits_not_replicated",
            standbys=state.standbys,
            synchronous_standby_names=state.synchronous_standby_names,
            synchronous_commit=state.synchronous_commit,
            meaning="an ack may follow a commit a failover loses",
        )
    return state
