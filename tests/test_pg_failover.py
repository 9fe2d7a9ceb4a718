"""The pg-failover profile's CI form, run exactly as `make chaos-pg` runs it.

A Patroni cluster of 3 PostgreSQL nodes (synchronous replication) whose
primary is SIGKILLed twice under load, its WAL senders paused before each
kill so the replicas lag, a switchover and a standby stop in between: every
message the workers acked has its effect on the final primary, once. The run
is a child process with its own RabbitMQ node and cluster; the shared
services are never touched. On a failure its work directory is kept and the
tails of its workers' and nodes' logs are printed; processes of a run that
did not end (postmasters outlive a killed Patroni) are killed.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from proving.chaos.patroni import kill_leftovers
from proving.chaos.pg_figures import largest_gaps
from proving.chaos.pg_schedule import PG_FAILOVER_CI
from tests.support import run_to_end

LINE = re.compile(r"^pg_failover: .*$", re.MULTILINE)
KEPT = re.compile(r"^chaos: logs kept in (\S+)$", re.MULTILINE)
TAIL = 2_000  # characters of each kept log printed on failure

pytestmark = pytest.mark.skipif(
    not (shutil.which("patroni") and shutil.which("etcd")),
    reason="needs Debian's patroni and etcd-server (.ci/run installs them)",
)


def _kept_logs(output: str) -> str:
    """The tails of the logs a failed run kept (its workers', each node's Patroni)."""
    found = KEPT.search(output)
    if found is None:
        return "(no logs kept)"
    workdir = Path(found.group(1))
    paths = sorted(workdir.glob("logs/*.log")) + sorted(workdir.glob("pg/node*/patroni.log"))
    return "\n".join(
        f"--- {path} ends:\n{path.read_text(errors='replace')[-TAIL:]}" for path in paths
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_pg_failover_ci_profile_loses_no_acked_effect_across_primary_kills() -> None:
    argv = [sys.executable, "-m", "consumers", "chaos", "--profile", PG_FAILOVER_CI.name]
    try:
        run = run_to_end(argv, timeout=140, grace=20)
    except AssertionError as timed_out:  # SIGTERMed: the stacks, then the logs it kept
        raise AssertionError(f"{timed_out}\n{_kept_logs(str(timed_out))}") from None
    finally:
        kill_leftovers()
    output = run.stdout + run.stderr
    found = LINE.findall(run.stdout)
    failed = f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}\n{_kept_logs(output)}"
    assert found, f"no pg_failover line\n{failed}"
    figures = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", found[-1])}
    assert (
        figures["lost"],
        figures["doubled"],
        figures["stuck"],
        figures["acked_but_missing"],
    ) == (0, 0, 0, 0), failed
    assert figures["primary_kills"] == PG_FAILOVER_CI.primary_kills, failed
    assert figures["switchovers"] == PG_FAILOVER_CI.switchovers, failed
    assert figures["standby_stops"] == PG_FAILOVER_CI.standby_stops, failed
    assert run.returncode == 0, failed


def test_a_faults_pause_is_found_whether_commits_stop_before_or_after_its_first_act() -> None:
    # A commit a second, but for two pauses: 3 to 15 and 41 to 52.
    commits = [float(t) for t in [*range(4), *range(15, 42), *range(52, 60)]]
    windows = [
        (3.5, 12.0),  # synchronous: the commits hung from 3.0, before the kill
        (39.5, 45.0),  # asynchronous: they went on past the first act, then 11 s
    ]
    assert largest_gaps(commits, windows) == [12.0, 11.0]
