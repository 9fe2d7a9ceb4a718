"""A batch's outcome lines: each held as its own bytes until the write, against appended.

    python -m proving.bench.lines [--lines 500] [--batches 40] [--rounds 7]

A batch of `--lines` `push_sent` lines (the fields `consumers.effects.answers`
logs, distinct per line) is rendered with the JSON set-up `configure_logging`
makes, written to /dev/null. `held`: each line's bytes kept in a list and
joined for one write (how `OutcomeLines` did it before 2026-12-06). `appended`:
`OutcomeLines` as it is, each line copied into one buffer as it is rendered.
Each round times both on the same dicts, in turn; the last line gives the
medians and their ratio. The difference is the allocator's, not orjson's:
orjson renders into a fresh 1 KiB buffer and trims it, and hundreds of
trimmed buffers held at once cost more than one reused.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from consumers.telemetry.logs import OutcomeLines, configure_logging, outcome_lines


def fields(n: int) -> dict[str, Any]:
    effect_id = f"8d0e2a04-59f7-503b-b414-{n:012d}"
    return {
        "provider_message_id": effect_id,
        "consumer": "pushbench.abcdef0123",
        "tenant": "",
        "message_id": f"order-abcd1234-{n}-shipped",
        "attempt": 1,
        "target": 0,
        "channel": "ios",
        "address": "abcd12…",
        "provider": "apns",
        "effect_id": effect_id,
        "collapse_id": f"order-abcd1234-{n}-shipped",
        "recorded": True,
    }


class HeldLines(OutcomeLines):
    """`OutcomeLines` before 2026-12-06: each line's bytes held until one joined write."""

    __slots__ = ("_chunks",)

    def __init__(self, lines: OutcomeLines) -> None:
        super().__init__(lines._setup)
        self._chunks: list[bytes] = []

    def line(self, event: str, level: str, fields: dict[str, Any]) -> None:
        if (rendered := self._rendered(event, level, fields)) is not None:
            self._chunks.append(rendered)  # orjson's own bytes, held until the write

    def flush(self) -> None:
        if self._chunks:
            self._chunks.append(b"")
            self._setup.file.write(b"\n".join(self._chunks))
            self._setup.file.flush()
            self._chunks.clear()


def microseconds_a_line(kind: str, count: int, batches: int) -> float:
    elapsed = 0.0
    for _ in range(batches):
        batch = [fields(n) for n in range(count)]  # taken over by the renderer, as in a run
        started = time.perf_counter()
        lines = outcome_lines()
        assert lines is not None
        if kind == "held":
            lines = HeldLines(lines)
        for line in batch:
            lines.line("push_sent", "info", line)
        lines.flush()
        elapsed += time.perf_counter() - started
    return elapsed / (count * batches) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=500, help="lines a batch (max_batch)")
    parser.add_argument("--batches", type=int, default=40, help="batches a round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with open("/dev/null", "wb") as sink:
        configure_logging("info", json=True, file=sink)
        before, after = [], []
        for round_ in range(1, args.rounds + 1):
            before.append(microseconds_a_line("held", args.lines, args.batches))
            after.append(microseconds_a_line("appended", args.lines, args.batches))
            print(f"round {round_}: held {before[-1]:.2f} µs a line, appended {after[-1]:.2f}")
    held_us, appended_us = statistics.median(before), statistics.median(after)
    print(
        f"lines_bench: lines={args.lines} held_us={held_us:.2f} appended_us={appended_us:.2f}"
        f" appended/held={appended_us / held_us:.2f}"
    )


if __name__ == "__main__":
    main()
