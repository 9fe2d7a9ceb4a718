"""The chaos suite's CI profile, run exactly as `make chaos` runs it.

A few thousand messages through a dozen faults of each kind (SIGKILLs, kills
at both crash points, rolling SIGTERMs, RabbitMQ and PostgreSQL restarts,
connection resets, half-open holds, latency, cut COMMITs), against a private
RabbitMQ node and PostgreSQL cluster the run starts and crashes itself: the
shared services the other tests use are never touched. It runs as a child
process so its own worker fleet, proxies and services live and die with it.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from proving.chaos.profile import CI
from tests.support import ROOT

LINE = re.compile(r"^chaos: messages=\d+ .*$", re.MULTILINE)


def _figures(line: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_ci_profile_loses_nothing_doubles_nothing_leaves_nothing_stuck() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "consumers", "chaos", "--profile", "ci"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    found = LINE.findall(run.stdout)
    assert found, f"no summary line\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    figures = _figures(found[-1])
    assert (figures["lost"], figures["doubled"], figures["stuck"]) == (0, 0, 0), run.stdout
    assert figures["max_attempts"] <= 5, run.stdout
    assert figures["kills"] >= 12 and figures["restarts"] >= 6, run.stdout
    assert figures["decode_poison"] == CI.decode_poison, run.stdout  # each with its reason
    assert figures["innocent_dead_lettered"] == 0, run.stdout
    assert run.returncode == 0, run.stdout[-3000:]
