"""`idempotent-workers` (also `python -m consumers`): migrate, run, relay, serve, api-key,
console, demo, cleanup, dlq, inspect, bench, chaos.

Configuration comes from the environment, read here and nowhere else:
AMQP_URL, DATABASE_URL, DATABASE_SCHEMA and the IW_* knobs of `Settings.from_env`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import asyncpg
import structlog

from consumers.commands import dlq, inspection
from consumers.handlers.app import load_app
from consumers.publishing.relay import run_relay
from consumers.retention import cleaner
from consumers.retention.retry_horizon import RetentionTooShort, check_retention, retention_need
from consumers.runtime.process import run_process
from consumers.settings import Settings
from consumers.telemetry.logs import configure_logging
from consumers.telemetry.tracing import tracing
from consumers.telemetry.tracing_setup import configure_tracing
from dedupe import DedupeError, migrate

log = structlog.get_logger(__name__)


async def _migrate(settings: Settings) -> int:
    conn = await asyncpg.connect(settings.database.url)
    try:
        applied = await migrate(conn, settings.database.schema)
    finally:
        await conn.close()
    print(f"migrate: schema={settings.database.schema} applied={applied or 'none (up to date)'}")
    return 0


def _processes(text: str) -> int:
    """`--processes N`, or `auto`: one per core."""
    if text == "auto":
        return os.cpu_count() or 1
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("at least 1 process")
    return n


def _check_retention_before_children(target: str, settings: Settings) -> None:
    """Refuse a too-short retention once, rather than in every child, restart after restart."""
    try:
        app = load_app(target)
    except Exception:
        return
    need = retention_need(app.specs, settings.retention, app.retry)
    check_retention(settings.retention.keep, need)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.processes > 1:
        _check_retention_before_children(args.target, settings)
    if args.processes == 1:
        return asyncio.run(run_process(args.target, settings))
    from consumers.runtime.supervisor import RestartPolicy, Supervisor

    supervisor = Supervisor(
        args.target,
        args.processes,
        settings,
        policy=RestartPolicy(max_restarts=args.max_restarts, window_seconds=args.restart_window),
        log_level=args.log_level,
    )
    return asyncio.run(supervisor.run())


# The extra each proving tool needs beyond the core: `pip install 'idempotent-workers[X]'`.
TOOL_EXTRAS = {"demo": "demo", "chaos": "demo", "bench": "bench"}


def _proving_tool(name: str) -> Any:
    """`proving.<name>`, imported by name: the framework never imports its proving tools."""
    extra = TOOL_EXTRAS[name]
    try:
        return _load(f"proving.{name}", "install the idempotent-workers package with its tools")
    except ModuleNotFoundError as exc:  # httpx, fastapi, aioapns...: the extra is missing
        raise SystemExit(
            f"idempotent-workers: {name} needs {exc.name}, from the {extra!r} extra: "
            f"pip install 'idempotent-workers[{extra}]'"
        ) from exc


def _load(module: str, hint: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name.split(".")[0]):
            raise SystemExit(
                f"idempotent-workers: {module} is not installed ({exc}); {hint}"
            ) from exc
        raise


def _ingress() -> Any:
    """`ingress.serve`, imported by name: the framework never imports its HTTP send API."""
    try:
        return _load("ingress.serve", "pip install 'idempotent-workers[serve]'")
    except ModuleNotFoundError as exc:  # fastapi, uvicorn: the extra is missing
        raise SystemExit(
            f"idempotent-workers: serve needs {exc.name}: pip install 'idempotent-workers[serve]'"
        ) from exc


def _console() -> Any:
    """`console.serve`, imported by name: the framework never imports its console."""
    try:
        return _load("console.serve", "pip install 'idempotent-workers[console]'")
    except ModuleNotFoundError as exc:  # fastapi, uvicorn, jinja2: the extra is missing
        raise SystemExit(
            f"idempotent-workers: console needs {exc.name}:"
            " pip install 'idempotent-workers[console]'"
        ) from exc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="idempotent-workers", description=__doc__)
    parser.add_argument("--log-level", default="info")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="create or upgrade the dedupe tables (safe to run concurrently)")
    run = sub.add_parser("run", help="run the handlers of MODULE:APP until SIGTERM")
    run.add_argument("target", metavar="MODULE:APP")
    run.add_argument(
        "--processes",
        type=_processes,
        default=1,
        metavar="N",
        help="worker processes under a supervisor (default 1: no supervisor; auto: one per core)",
    )
    run.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="with --processes: give up (exit 1) past this many deaths within --restart-window",
    )
    run.add_argument("--restart-window", type=float, default=60.0, metavar="SECONDS")
    sub.add_parser("relay", help="publish the outbox with confirms until SIGTERM (IW_RELAY_*)")
    demo = sub.add_parser("demo", help="the end-to-end demo: crashes, duplicates, a report")
    demo.add_argument("--jobs", type=int, default=10_000)
    demo.add_argument("--pushes", type=int, default=1_000)
    demo.add_argument("--workers", type=int, default=2)
    cleaner.register(sub)
    serve = sub.add_parser("serve", help="the HTTP send API (POST /v1/messages) until SIGTERM")
    serve.add_argument("args", nargs=argparse.REMAINDER)
    api_key = sub.add_parser("api-key", help="api-key create --tenant T: a key for serve")
    api_key.add_argument("args", nargs=argparse.REMAINDER)
    console = sub.add_parser(
        "console", help="the operator console (web pages); console token create|revoke"
    )
    console.add_argument("args", nargs=argparse.REMAINDER)
    bench = sub.add_parser("bench", help="throughput and latency against a bare consumer")
    bench.add_argument("args", nargs=argparse.REMAINDER)
    chaos = sub.add_parser("chaos", help="faults on a schedule, then count lost and doubled")
    chaos.add_argument("args", nargs=argparse.REMAINDER)
    dlq.register(sub)
    inspection.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    # REMAINDER does not take options that come first (`chaos --profile full`):
    # bench and chaos get whatever the top-level parser does not know.
    args, unknown = parser.parse_known_args(argv)
    passthrough = ("bench", "chaos", "serve", "api-key", "console")
    if unknown and args.command not in passthrough:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command in passthrough:
        args.args = [*unknown, *args.args]
    configure_logging(args.log_level)
    settings = Settings.from_env()
    configure_tracing(settings.tracing)
    try:
        return _command(args, settings)
    finally:
        tracing().shutdown()  # the spans not yet exported, before the process exits


def _command(args: argparse.Namespace, settings: Settings) -> int:
    try:
        if args.command == "migrate":
            return asyncio.run(_migrate(settings))
        if args.command == "cleanup":
            return asyncio.run(cleaner.run(args, settings))
        if args.command == "run":
            return _run(args, settings)
        if args.command == "relay":
            return asyncio.run(run_relay(settings))
        if args.command == "demo":
            run_demo = _proving_tool("demo").run_demo
            code: int = asyncio.run(
                run_demo(settings, jobs=args.jobs, pushes=args.pushes, workers=args.workers)
            )
            return code
        if args.command in ("bench", "chaos"):
            tool_main = _proving_tool(args.command).main
            code = tool_main(args.args, settings)
            return code
        if args.command == "serve":
            code = _ingress().serve_main(args.args, settings)
            return code
        if args.command == "api-key":
            code = _ingress().api_key_main(args.args, settings)
            return code
        if args.command == "console":
            code = _console().console_main(args.args, settings)
            return code
        if args.command == "dlq":
            return asyncio.run(dlq.run(args, settings))
        if args.command == "inspect":
            return asyncio.run(inspection.run(args, settings))
    except RetentionTooShort as exc:
        print(f"idempotent-workers: {exc}", file=sys.stderr)
        return 2
    except DedupeError as exc:
        print(f"idempotent-workers: {exc}", file=sys.stderr)
        return 2
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
