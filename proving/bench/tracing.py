"""`python -m proving.bench.tracing`: what tracing costs the worker, alternated in one run.

Each round runs `idempotent-workers bench --variants framework` three times, in
an order that rotates from round to round, each in a process of its own on the
same services:

    before   the framework of --baseline-tree (a checkout of the commit before
             tracing: `git worktree add ../iw-before 54a7f54`), no OTEL_* variables
    off      this checkout, no OTEL_* variables: tracing off
    on       this checkout, tracing on: every message sampled (the SDK's default
             sampler), spans exported over OTLP/HTTP every OTEL_BSP_SCHEDULE_DELAY
             to a local receiver that only counts them (`proving.otlp`, decode=False)

and prints each run's rate (messages/s, first delivery to last ack) and, per
round, off/before and on/off; the last line gives the medians:

    tracing_bench: before=… off=… on=… off/before=… on/off=… rounds=5 messages=20000 sampled=1.0

`--sample 0.01` runs "on" with OTEL_TRACES_SAMPLER=parentbased_traceidratio at that
share. First it prints `span_cost:` the CPU one message span takes in this
process's SDK (start and end, then the OTLP encoding), for reading the ratio
against the framework's CPU a message.

Both sides log at info to a file, as production does. Needs the `tracing` extra.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from opentelemetry import trace

from proving.otlp import start_receiver

HERE = Path(__file__).resolve().parents[2]
_RATE = re.compile(r"framework=(\d+)")


def _env(tree: Path, otlp: str | None, sample: float | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(tree)
    if otlp is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp
        env["OTEL_SERVICE_NAME"] = "tracing-bench"
        if sample is not None:
            env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
            env["OTEL_TRACES_SAMPLER_ARG"] = str(sample)
    return env


def span_cost(spans: int = 20_000) -> tuple[float, float]:
    """µs of CPU to start and end one message's span, and to encode it as OTLP.

    The worker's message span as `consumers.pipeline.traced` makes it (a remote
    parent, six attributes, a link), through the SDK's own tracer with an
    in-memory processor; then the OTLP/HTTP exporter's own encoder over them.
    """
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    kept = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    tracer = provider.get_tracer("span-cost")
    batch = tracer.start_span("process q")
    parent = trace.set_span_in_context(tracer.start_span("publish q"))
    link = [trace.Link(batch.get_span_context())]
    attributes: dict[str, str | int] = {
        "messaging.system": "rabbitmq",
        "messaging.destination.name": "q",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": "order-1042-shipped",
        "idempotent_workers.attempt": 1,
    }
    started = time.process_time()
    for _ in range(spans):
        span = tracer.start_span("process q", context=parent, attributes=attributes, links=link)
        span.set_attribute("idempotent_workers.outcome", "effect_committed")
        span.end()
    made = time.process_time() - started
    finished = kept.get_finished_spans()
    started = time.process_time()
    for at in range(0, len(finished), 512):  # the batch processor's export size
        encode_spans(finished[at : at + 512]).SerializeToString()
    encoded = time.process_time() - started
    return made / spans * 1e6, encoded / spans * 1e6


def run_once(tree: Path, messages: int, env: Mapping[str, str], log: Path) -> float:
    """One framework run of `tree`'s bench; its rate in messages a second."""
    done = subprocess.run(
        [
            sys.executable, "-m", "consumers", "bench",
            "--variants", "framework", "--repeats", "1", "--messages", str(messages),
            "--paced-seconds", "0", "--log-file", str(log),
        ],
        cwd=tree, env=dict(env), capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    found = [m for line in done.stdout.splitlines() if (m := _RATE.search(line))]
    if done.returncode != 0 or not found:
        raise SystemExit(
            f"tracing_bench: the bench of {tree} failed (exit {done.returncode}):\n"
            + (done.stdout + done.stderr)[-3000:]
        )
    return float(found[-1][1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.tracing", description=__doc__)
    parser.add_argument(
        "--baseline-tree", type=Path, required=True, help="a checkout of the commit before tracing"
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=HERE,
        help="the checkout measured off and on (default: this one); a checkout of the commit"
        " that brought tracing isolates its cost from what landed since",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of three runs (medians)")
    parser.add_argument("--messages", type=int, default=20_000, help="per run")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"), help="each run's log file")
    parser.add_argument(
        "--sample",
        type=float,
        default=None,
        help="on samples this share of traces (parentbased_traceidratio); default: every one",
    )
    args = parser.parse_args(argv)
    made, encoded = span_cost()
    print(f"span_cost: start+end={made:.1f}us encode={encoded:.1f}us a message span (CPU)")
    receiver = start_receiver(decode=False)
    sides = {
        "before": (args.baseline_tree.resolve(), None),
        "off": (args.tree.resolve(), None),
        "on": (args.tree.resolve(), f"http://127.0.0.1:{receiver.server.server_address[1]}"),
    }
    rates: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    try:
        for n in range(args.rounds):
            turn = order[n % 3 :] + order[: n % 3]  # each side first, then second, then third
            for name in turn:
                tree, otlp = sides[name]
                log = args.log_dir / f"tracing-bench-{name}.log"
                env = _env(tree, otlp, args.sample)
                rates[name].append(run_once(tree, args.messages, env, log))
            off, on, before = rates["off"][-1], rates["on"][-1], rates["before"][-1]
            print(
                f"round {n + 1}: before={before:.0f} off={off:.0f} on={on:.0f}"
                f" off/before={off / before:.3f} on/off={on / off:.3f}"
                f" (spans received so far: {receiver.received_bytes:,} bytes"
                f" in {receiver.requests} exports)",
                flush=True,
            )
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
    median = {name: statistics.median(values) for name, values in rates.items()}
    ratios_off = [o / b for o, b in zip(rates["off"], rates["before"], strict=True)]
    ratios_on = [o / f for o, f in zip(rates["on"], rates["off"], strict=True)]
    print(
        f"tracing_bench: before={median['before']:.0f} off={median['off']:.0f}"
        f" on={median['on']:.0f} off/before={statistics.median(ratios_off):.3f}"
        f" on/off={statistics.median(ratios_on):.3f} rounds={args.rounds}"
        f" messages={args.messages} sampled={args.sample if args.sample is not None else 1.0}"
    )
    if receiver.requests == 0:
        print("tracing_bench: WRONG the traced runs exported nothing")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
