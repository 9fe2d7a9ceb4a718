"""The bench's command line: `idempotent-workers bench [options]`."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from consumers import QueueType

ALL_VARIANTS = (
    "ceiling",
    "bare",
    "aiormq",
    "handwritten",
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
# What the summary lines need; --long adds the ones that price one thing each
# (acking each message, FastStream's prefetch, a round trip per effect, logging).
DEFAULT_VARIANTS = (
    "ceiling",
    "bare",
    "aiormq",
    "handwritten",
    "naive",
    "faststream",
    "framework",
    "framework_batch",
    "publisher_each",
    "publisher_pipelined",
    "relay",
)
# The sending side (proving.bench.sending): publishers and the outbox relay.
SENDING_VARIANTS = ("publisher_each", "publisher_pipelined", "relay")
PACED_VARIANTS = ("ceiling", "framework", "framework_batch")
PREFILL_VARIANTS = ("handwritten", "framework", "framework_batch")
# Slow forms, a run of --slow-messages each: a rate (and so a ratio) needs a
# few seconds of one, not a backlog that keeps the bench waiting for minutes.
SLOW_VARIANTS = ("naive", "faststream", "faststream_prefetch", "publisher_each")

# The default bench (about 5 minutes on 2 cores) and its long form (--long:
# ALL_VARIANTS, LONG_MESSAGES each).
MESSAGES = 10_000
SLOW_MESSAGES = 1_000
LONG_MESSAGES = 20_000  # every variant, the slow ones too; --scale's default


class EventLoop(StrEnum):
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


# A real file, as production writes to one (or a pipe to a collector): a
# write to /dev/null would leave out the cost of the write itself.
DEFAULT_LOG_FILE = str(Path(tempfile.gettempdir()) / "idempotent-workers-bench.log")


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    messages: int = MESSAGES  # per run
    slow_messages: int = SLOW_MESSAGES  # per run of a SLOW_VARIANTS one
    long: bool = False  # the long form: LONG_MESSAGES for every variant
    repeats: int = 3
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    prefetch: int = 1000
    queue_type: QueueType | None = None  # None: the worker's setting (quorum by default)
    paced_seconds: float = 10.0  # 0: no paced mode
    paced_rate: float | None = None  # msg/s of the paced mode; None: half the framework's rate
    prefill: int = 0  # rows put in processed_messages before a second round
    log_file: str = DEFAULT_LOG_FILE
    loop: EventLoop = EventLoop.ASYNCIO
    timeout: float = 300.0  # per run
    profile: str | None = None  # a variant to sample with py-spy while it consumes
    phases: bool = False  # time each paced framework batch's phases (proving.bench.phases)
    scale: bool = False  # instead: 1 and 2 framework processes beside bare ones


def bench_parser() -> argparse.ArgumentParser:
    """The flags of `idempotent-workers bench`."""
    parser = argparse.ArgumentParser(
        prog="idempotent-workers bench",
        description="Throughput and delivery-to-ack latency of our worker beside a bare"
        " aio-pika consumer, a naive exactly-once consumer and FastStream, interleaved,"
        " median of --repeats runs, on the services of AMQP_URL and DATABASE_URL.",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=None,
        help=f"per run (default {MESSAGES:,}; with --long {LONG_MESSAGES:,})",
    )
    parser.add_argument(
        "--slow-messages",
        type=int,
        default=None,
        help=f"per run of the slow ones, {', '.join(SLOW_VARIANTS)} (default {SLOW_MESSAGES:,}"
        " or --messages if fewer; with --long as many as --messages)",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help=f"the long form: every variant, {LONG_MESSAGES:,} messages a run each, the slow"
        " ones too (over 20 minutes on 2 cores, where the default takes about 5)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant (median)")
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated, from: "
        + ", ".join(ALL_VARIANTS)
        + f" (default: {', '.join(DEFAULT_VARIANTS)}; with --long all of them)",
    )
    parser.add_argument(
        "--prefetch", type=int, default=1000, help="unacked deliveries a channel (default 1000)"
    )
    parser.add_argument(
        "--queue-type",
        choices=[t.value for t in QueueType],
        default=None,
        help="of the bench's queues (default: the worker's, IW_QUEUE_TYPE)",
    )
    parser.add_argument(
        "--paced-seconds",
        type=float,
        default=10.0,
        help="p99 latency at half the framework's (and the relay's) rate for this long (0: skip)",
    )
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=None,
        metavar="MSG_PER_S",
        help="pace at this rate instead of half the framework's, so that two commits or"
        " two machines are compared at one rate",
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
    parser.add_argument(
        "--loop",
        choices=[e.value for e in EventLoop],
        default="asyncio",
        help="the event loop every variant runs on (default asyncio)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run at most")
    parser.add_argument(
        "--profile",
        metavar="VARIANT",
        default=None,
        help="sample VARIANT's runs with py-spy and print where the time goes",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="time the phases of every paced framework batch (wait, decode, BEGIN, claim,"
        " effects, COMMIT, settle) and print their p50/p99 and how busy the batch slot was",
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="instead of the variants: 1 and 2 framework processes (run --processes 2) beside"
        " 1 and 2 bare aio-pika consumer processes, on one queue; prints the scale: line",
    )
    return parser


def parse(argv: Sequence[str]) -> BenchOptions:
    """The options of `idempotent-workers bench` from its arguments (exits on a bad one)."""
    parser = bench_parser()
    argv = list(argv)
    if argv[:1] == ["--"]:  # `idempotent-workers bench -- --messages 5000`
        argv = argv[1:]
    args = parser.parse_args(argv)
    if args.variants is None:
        variants = ALL_VARIANTS if args.long else DEFAULT_VARIANTS
    else:
        variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = sorted(set(variants) - set(ALL_VARIANTS))
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)}")
    if args.profile is not None and args.profile not in variants:
        parser.error(f"--profile {args.profile}: not among --variants")
    long_form = args.long or args.scale
    messages = args.messages
    if messages is None:
        messages = LONG_MESSAGES if long_form else MESSAGES
    slow_messages = args.slow_messages
    if slow_messages is None:
        slow_messages = messages if long_form else min(messages, SLOW_MESSAGES)
    if min(messages, slow_messages, args.repeats) < 1:
        parser.error("--messages, --slow-messages and --repeats must be at least 1")
    if args.paced_rate is not None and not args.paced_rate >= 1:
        parser.error("--paced-rate must be at least 1 message a second")
    return BenchOptions(
        messages=messages,
        slow_messages=slow_messages,
        long=args.long,
        repeats=args.repeats,
        variants=variants,
        prefetch=args.prefetch,
        queue_type=QueueType(args.queue_type) if args.queue_type else None,
        paced_seconds=args.paced_seconds,
        paced_rate=args.paced_rate,
        prefill=args.prefill,
        log_file=args.log_file,
        loop=EventLoop(args.loop),
        timeout=args.timeout,
        profile=args.profile,
        phases=args.phases,
        scale=args.scale,
    )
