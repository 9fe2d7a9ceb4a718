"""`idempotent-workers` (also `python -m consumers`): RabbitMQ workers whose effects
happen exactly once. `idempotent-workers COMMAND --help` says what each command does.

Configuration comes from the environment, read here and nowhere else:
AMQP_URL, DATABASE_URL, DATABASE_SCHEMA and the IW_* knobs of `Settings.from_env`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog

from consumers.commands import dlq, inspection, webhooks
from consumers.handlers.loading import AppNotLoaded, load_app
from consumers.publishing.relay import run_relay
from consumers.retention import cleaner
from consumers.retention.retry_horizon import RetentionTooShort, check_retention, retention_need
from consumers.runtime.process import run_process
from consumers.settings import Settings
from consumers.telemetry.failed_start import app_not_loaded
from consumers.telemetry.logs import configure_logging
from consumers.telemetry.tracing import tracing
from consumers.telemetry.tracing_setup import configure_tracing
from dedupe import DedupeError, migrate

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """A command whose flags and code live in a package the framework never imports.

    The CLI loads it by name when the command runs, and hands it every argument
    (`--help` included: its own parser answers). `parsers` names the function
    building the parser of each word after the command ("" for the command
    itself): `tests/test_cli_help.py` walks them.
    """

    help: str
    main: str  # "module:function", called as function(argv, settings) -> exit status
    parsers: Mapping[str, str]  # word after the command -> "module:function" building its parser
    extra: str  # pip install 'idempotent-workers[extra]' brings what it needs


TOOLS = {
    "serve": Tool(
        help="the HTTP send API (POST /v1/messages) until SIGTERM",
        main="ingress.serve:serve_main",
        parsers={"": "ingress.serve:serve_parser"},
        extra="serve",
    ),
    "api-key": Tool(
        help="the send API's keys: create, list, revoke",
        main="ingress.key_commands:api_key_main",
        parsers={"": "ingress.key_commands:api_key_parser"},
        extra="serve",
    ),
    "console": Tool(
        help="the operator console (web pages) until SIGTERM; console token create|revoke",
        main="console.serve:console_main",
        parsers={"": "console.serve:console_parser", "token": "console.serve:token_parser"},
        extra="console",
    ),
    "bench": Tool(
        help="throughput and latency beside a bare consumer (prints figures)",
        main="proving.bench:main",
        parsers={"": "proving.bench.options:bench_parser"},
        extra="bench",
    ),
    "chaos": Tool(
        help="faults on a schedule, then count lost and doubled",
        main="proving.chaos:main",
        parsers={"": "proving.chaos:chaos_parser"},
        extra="demo",
    ),
}


def load_entry(command: str, entry: str, extra: str) -> Any:
    """`module:function` of a tool, imported by name (the framework never imports it).

    A missing extra (httpx, fastapi...) or package exits with the line to install it.
    """
    module, _, function = entry.partition(":")
    install = f"pip install 'idempotent-workers[{extra}]'"
    try:
        return getattr(importlib.import_module(module), function)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name.split(".")[0]):
            raise SystemExit(
                f"idempotent-workers: {module} is not installed ({exc}); {install}"
            ) from exc
        raise SystemExit(
            f"idempotent-workers: {command} needs {exc.name}, from the {extra!r} extra: {install}"
        ) from exc


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


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.processes == 1:
        return asyncio.run(run_process(args.target, settings, app_dir=args.app_dir))
    from consumers.runtime.supervisor import RestartPolicy, Supervisor

    # Before any child: an app that is not there, or a retention its retry
    # policies outlive, is said once, not by every child, restart after restart.
    app = load_app(args.target, app_dir=args.app_dir)
    check_retention(
        settings.retention.keep, retention_need(app.specs, settings.retention, app.retry)
    )
    supervisor = Supervisor(
        args.target,
        args.processes,
        settings,
        policy=RestartPolicy(max_restarts=args.max_restarts, window_seconds=args.restart_window),
        log_level=args.log_level,
        app_dir=args.app_dir,
    )
    return asyncio.run(supervisor.run())


def _subcommand(sub: Any, name: str, said: str, **options: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=said, description=said, **options)
    return parser


def _register_run(sub: Any) -> None:
    run = _subcommand(sub, "run", "run the handlers of MODULE:APP until SIGTERM")
    run.add_argument("target", metavar="MODULE:APP", help="the App to run: shipments:app")
    run.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="look for MODULE in DIR first (default: the working directory)",
    )
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
    run.add_argument(
        "--restart-window",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="the window --max-restarts counts deaths in (default 60)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="idempotent-workers", description=__doc__)
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="COMMAND --help: its flags"
    )
    _subcommand(sub, "migrate", "create or upgrade the dedupe tables (safe to run concurrently)")
    _register_run(sub)
    _subcommand(sub, "relay", "publish the outbox with confirms until SIGTERM (IW_RELAY_*)")
    demo = _subcommand(sub, "demo", "the end-to-end demo: crashes, duplicates, a report")
    demo.add_argument("--jobs", type=int, default=10_000, help="local jobs (default 10,000)")
    demo.add_argument("--pushes", type=int, default=1_000, help="push jobs (default 1,000)")
    demo.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    cleaner.register(sub)
    dlq.register(sub)
    inspection.register(sub)
    webhooks.register(sub)
    for name, tool in TOOLS.items():
        # No -h of its own: `--help` goes on to the tool's parser, which lists its flags.
        passing = _subcommand(sub, name, tool.help, add_help=False)
        passing.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    # REMAINDER does not take options that come first (`chaos --profile full`):
    # a tool gets whatever the top-level parser does not know.
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command not in TOOLS:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command in TOOLS:
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
            run_demo = load_entry("demo", "proving.demo:run_demo", "demo")
            code: int = asyncio.run(
                run_demo(settings, jobs=args.jobs, pushes=args.pushes, workers=args.workers)
            )
            return code
        if args.command == "dlq":
            return asyncio.run(dlq.run(args, settings))
        if args.command == "inspect":
            return asyncio.run(inspection.run(args, settings))
        if args.command == "webhook":
            return asyncio.run(webhooks.run(args, settings))
        tool = TOOLS[args.command]
        code = load_entry(args.command, tool.main, tool.extra)(args.args, settings)
        return code
    except AppNotLoaded as exc:
        return app_not_loaded(exc)
    except RetentionTooShort as exc:
        print(f"idempotent-workers: {exc}", file=sys.stderr)
        return 2
    except DedupeError as exc:
        print(f"idempotent-workers: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
