"""What the pg-failover run reads back from the workers' logs and the final primary.

    acked_keys      (tenant, message_id) of every local job a worker logged as acked
    commit_stamps   when each of the workers' COMMITs returned (`effect_committed`)
    largest_gaps    per fault, the longest pause between commits around it

A fault's window runs from its first act (the senders paused, the
switchover asked) to the new leader seen, then on for AFTER_S or until the
next fault begins; its pause is the largest gap between consecutive commits
from the last one before the window to the last one in it (to the first one
after it, if none came in it). A pause that begins before the kill
(synchronous commits hang once the senders stop) and one that begins after
(asynchronous commits go on until the kill) are both found.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

from proving.chaos.app import LOCAL_QUEUE

ACKED = ('"effect_committed"', '"duplicate_ignored"')
AFTER_S = 30.0  # past the new leader, for the commits to resume


def acked_keys(log_dir: Path) -> set[tuple[str, str]]:
    """(tenant, message_id) of every message a worker logged as acked."""
    keys: set[tuple[str, str]] = set()
    for path in log_dir.glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if any(mark in line for mark in ACKED) and LOCAL_QUEUE in line:
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    keys.add((str(record.get("tenant", "")), str(record["message_id"])))
    return keys


def commit_stamps(log_dir: Path) -> list[float]:
    """Wall-clock time of each `effect_committed` line (logged once COMMIT returned), sorted."""
    stamps = []
    for path in log_dir.glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if '"effect_committed"' in line:
                with contextlib.suppress(ValueError, KeyError):
                    when = datetime.datetime.fromisoformat(json.loads(line)["timestamp"])
                    stamps.append(when.timestamp())
    return sorted(stamps)


def largest_gaps(stamps: Sequence[float], windows: Sequence[tuple[float, float]]) -> list[float]:
    """Per (start, end) window of a fault: the largest gap between commits in it, s."""
    gaps = []
    starts = [start for start, _ in windows[1:]] + [float("inf")]
    for (start, end), following in zip(windows, starts, strict=True):
        limit = min(end + AFTER_S, following)
        low = max(0, bisect.bisect_right(stamps, start) - 1)
        high = bisect.bisect_right(stamps, limit)
        if high <= low + 1:  # none resumed within the window: the first one after it
            high = min(len(stamps), high + 1)
        around = stamps[low:high]
        if len(around) >= 2:
            gaps.append(max(b - a for a, b in itertools.pairwise(around)))
    return gaps
