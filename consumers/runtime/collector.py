"""The garbage collector in a worker process, whose live objects are mostly work in flight.

A worker holds thousands of objects that live for one batch: deliveries, a
task, a coroutine and futures for each push in flight, the HTTP/2 streams of
its provider. CPython's default thresholds (700, 10, 10) start a young
collection every 700 net allocations of container objects, and the older ones
every 10 of the younger: each pass walks the work in flight again, and a full
collection walks all of it. `gc.freeze()` (what exists once the worker started
lives as long as the process) does not make full ones rare: CPython starts one
when the objects not yet walked as old exceed a quarter of those that were,
and the frozen ones no longer count among those. In the push bench's process
(`python -m proving.bench.push --runs 1`: the bare provider's 5,000 sends,
then 10,000 one-device and 10,000 fan-out sends) the collector at its defaults
ran about 2,200 young, 200 middle and 17 full collections, 1.7 to 2.0 s in
all; with (10,000, 20, 100), about 105 young and 3 middle, 0.5 to 0.6 s
(the message of 29e991a).

The young threshold counts container objects allocated less those freed,
and the frees of older objects count too. So the count swings with the work
in flight, and a young collection walks every young object still alive, not
the threshold's number: at 10,000, the push bench's worker ran 133 young
collections in a round of 20,000 one-device jobs, of 11,948 objects each at
the median (27,540 at most) and 1.2 ms (6 ms at most); the worker took 8%
to 11% more CPU a send than at 100,000 (alternated pairs, the message of
1cb75f5). At 100,000 that round ran none, and a round of
60,000 jobs two, of about 100,000 objects and 30 to 43 ms each. At 30,000
the collections were fewer (about 20 in 20,000 jobs) but larger (15 ms),
and cost about as much in all as at 10,000.
"""

from __future__ import annotations

import gc

# Container objects allocated less those freed, between young collections (CPython: 700).
YOUNG_THRESHOLD = 100_000
# Young collections between middle ones (CPython: 10).
MIDDLE_THRESHOLD = 20
# Middle collections between full ones, which walk everything not frozen (CPython: 10).
OLD_THRESHOLD = 100


def collect_less() -> None:
    """Thresholds for a worker process: fewer passes over the work in flight."""
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)


def freeze_started() -> None:
    """What exists once the worker started lives as long as the process: out of the
    collector's sight, as `serve` does. A full collection of it cost the push bench's
    worker 0.4 s of 4.6 s in 10,000 jobs."""
    gc.freeze()
