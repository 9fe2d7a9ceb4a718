"""The bench's command line: `idempotent-workers bench [options]`."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from consumers import QueueType

DEFAULT_VARIANTS = (
    "ceiling",
    "ceiling_each",
    "naive",
    "faststream",
    "faststream_prefetch",
    "framework",
    "framework_batch",
    "framework_execute",
    "framework_quiet",
    "publisher_each",
    "publisher_pipelined",
    "relay",
)
# The sending side (proving.bench.sending): publishers and the outbox relay.
SENDING_VARIANTS = ("publisher_each", "publisher_pipelined", "relay")
PACED_VARIANTS = ("ceiling", "framework", "framework_batch")
PREFILL_VARIANTS = ("framework", "framework_batch")


class EventLoop(StrEnum):
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


# A real file, as production writes to one (or a pipe to a collector): a
# write to /dev/null would leave out the cost of the write itself.
DEFAULT_LOG_FILE = str(Path(tempfile.gettempdir()) / "idempotent-workers-bench.log")


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    messages: int = 20_000
    repeats: int = 3
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    prefetch: int = 1000
    queue_type: QueueType | None = None  # None: the worker's setting (quorum by default)
    paced_seconds: float = 10.0  # 0: no paced mode
    prefill: int = 0  # rows put in processed_messages before a second round
    log_file: str = DEFAULT_LOG_FILE
    loop: EventLoop = EventLoop.ASYNCIO
    timeout: float = 300.0  # per run
    profile: str | None = None  # a variant to sample with py-spy while it consumes
    scale: bool = False  # instead: 1 and 2 framework processes beside bare ones


def parse(argv: Sequence[str]) -> BenchOptions:
    parser = argparse.ArgumentParser(
        prog="idempotent-workers bench",
        description="Throughput and delivery-to-ack latency of our worker beside a bare"
        " aio-pika consumer, a naive exactly-once consumer and FastStream, interleaved,"
        " median of --repeats runs, on the services of AMQP_URL and DATABASE_URL.",
    )
    parser.add_argument("--messages", type=int, default=20_000, help="per run (default 20000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant (median)")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="comma-separated, from: " + ", ".join(DEFAULT_VARIANTS),
    )
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--queue-type", choices=[t.value for t in QueueType], default=None)
    parser.add_argument(
        "--paced-seconds",
        type=float,
        default=10.0,
        help="p99 latency at half the framework's (and the relay's) rate for this long (0: skip)",
    )
    parser.add_argument(
        "--prefill",
        type=int,
        default=0,
        metavar="ROWS",
        help="then fill processed_messages with ROWS rows and run the framework again",
    )
    parser.add_argument(
        "--log-file",
        default=DEFAULT_LOG_FILE,
        help="where the JSON log lines go, emptied first (default: %(default)s)",
    )
    parser.add_argument("--loop", choices=[e.value for e in EventLoop], default="asyncio")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run at most")
    parser.add_argument(
        "--profile",
        metavar="VARIANT",
        default=None,
        help="sample VARIANT's runs with py-spy and print where the time goes",
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="instead of the variants: 1 and 2 framework processes (run --processes 2) beside"
        " 1 and 2 bare aio-pika consumer processes, on one queue; prints the scale: line",
    )
    argv = list(argv)
    if argv[:1] == ["--"]:  # `idempotent-workers bench -- --messages 5000`
        argv = argv[1:]
    args = parser.parse_args(argv)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = sorted(set(variants) - set(DEFAULT_VARIANTS))
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)}")
    if args.profile is not None and args.profile not in variants:
        parser.error(f"--profile {args.profile}: not among --variants")
    if args.messages < 1 or args.repeats < 1:
        parser.error("--messages and --repeats must be at least 1")
    return BenchOptions(
        messages=args.messages,
        repeats=args.repeats,
        variants=variants,
        prefetch=args.prefetch,
        queue_type=QueueType(args.queue_type) if args.queue_type else None,
        paced_seconds=args.paced_seconds,
        prefill=args.prefill,
        log_file=args.log_file,
        loop=EventLoop(args.loop),
        timeout=args.timeout,
        profile=args.profile,
        scale=args.scale,
    )
