"""The chaos suite's CI profile, run exactly as `make chaos` runs it.

A few thousand messages through a dozen faults of each kind (SIGKILLs, kills
at both crash points, rolling SIGTERMs, RabbitMQ and PostgreSQL restarts,
connection resets, half-open holds, latency, cut COMMITs) and the users' own
failures (handlers past their deadline, handlers that block the event loop
until the watchdog ends the worker, decode poison), against a private
RabbitMQ node and PostgreSQL cluster the run starts and crashes itself: the
shared services the other tests use are never touched. It runs as a child
process so its own worker fleet, proxies and services live and die with it.
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

from proving.chaos.app import LOCAL_QUEUE, SLOW_QUEUE, Act
from proving.chaos.checker import observed_timeouts
from proving.chaos.fleet import Fleet
from proving.chaos.profile import CI
from proving.chaos.workload import JobKind, plan
from tests.support import run_to_end

LINE = re.compile(r"^chaos: messages=\d+ .*$", re.MULTILINE)


def _row(output: str, name: str) -> str:
    """The value of the run's table row `name`."""
    found = re.search(rf"^{re.escape(name)} +(\S+)$", output, re.MULTILINE)
    assert found, f"no row {name!r}\n{output[-3000:]}"
    return found.group(1)


def _figures(line: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_ci_profile_loses_nothing_doubles_nothing_leaves_nothing_stuck() -> None:
    run = run_to_end([sys.executable, "-m", "consumers", "chaos", "--profile", "ci"], timeout=780)
    found = LINE.findall(run.stdout)
    assert found, f"no summary line\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    figures = _figures(found[-1])
    assert (figures["lost"], figures["doubled"], figures["stuck"]) == (0, 0, 0), run.stdout
    assert figures["max_attempts"] <= 5, run.stdout
    assert figures["kills"] >= 12 and figures["restarts"] >= 6, run.stdout
    assert figures["decode_poison"] == CI.decode_poison, run.stdout  # each with its reason
    assert figures["innocent_dead_lettered"] == 0, run.stdout
    # Each planned hang ended by its worker's watchdog (exit 70), none unplanned.
    assert figures["hangs"] == CI.hangs > 0, run.stdout
    assert _row(run.stdout, "watchdog exits with no planned hang") == "0", run.stdout
    assert figures["handler_timeouts"] > 0, run.stdout
    # Every one of them, timed out or hung, took effect exactly once.
    timeouts = CI.handler_timeouts
    assert _row(run.stdout, "timed-out jobs effected once") == f"{timeouts}/{timeouts}", run.stdout
    assert _row(run.stdout, "hang jobs effected once") == f"{CI.hangs}/{CI.hangs}", run.stdout
    assert run.returncode == 0, run.stdout[-3000:]


def test_plan_puts_timeouts_and_hangs_among_batchmates_on_the_slow_queue() -> None:
    jobs = plan(messages=1_000, poison=0, malformed=0, rng=random.Random(1), timeouts=7, hangs=2)
    local = [j for j in jobs if j.kind is JobKind.LOCAL]
    slow = [j for j in local if j.queue == SLOW_QUEUE]
    acts = [j.act for j in slow]
    assert (acts.count(Act.TIMEOUT), acts.count(Act.HANG)) == (7, 2)
    assert len(slow) > 9  # and batchmates that do nothing wrong
    assert all(j.act is Act.NONE for j in local if j.queue == LOCAL_QUEUE)
    assert all(b'"act":"timeout"' in j.body for j in slow if j.act is Act.TIMEOUT)


def test_timeouts_are_counted_from_the_workers_outcome_lines(tmp_path: Path) -> None:
    (tmp_path / "worker-0.log").write_text(
        '{"consumer":"chaos.slow","message_id":"local-10","reason":"handler_timeout",'
        '"event":"retry_scheduled"}\n'
        '{"consumer":"chaos.slow","message_id":"local-10","reason":"handler_timeout",'
        '"event":"retry_scheduled"}\n'
        '{"consumer":"chaos.local","message_id":"local-11","reason":"handler_timeout",'
        '"event":"retry_scheduled"}\n'
        '{"consumer":"chaos.slow","message_id":"local-20","reason":"handler_ti'  # cut by a kill
    )
    (tmp_path / "worker-1.log").write_text(
        '{"consumer":"chaos.slow","message_id":"local-30","reason":"handler_timeout",'
        '"event":"retry_scheduled"}\n'
    )
    assert observed_timeouts(tmp_path) == {"local-10": 2, "local-30": 1}


def test_a_relay_that_exits_keeps_its_own_log(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker-0.log").write_text("a worker's line\n")
    (logs / "relay-0.log").write_text("the relay's last line\n")
    relays = Fleet(
        size=1,
        env={},
        log_dir=logs,
        crash_quota={},
        max_crash_after=0,
        rng=random.Random(1),
        name="relay",
    )
    relays._keep_log(relays.slots[0], 1, "exited by itself")
    assert [p.read_text() for p in relays.kept_logs] == ["the relay's last line\n"]
    assert relays.kept_logs[0].name.startswith(f"{tmp_path.name}-relay-0-")
