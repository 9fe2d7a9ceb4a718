"""The send API's bench: new keys and replays against the same server's trivial 202 endpoint.

    python -m proving.bench.ingress [--rounds 3] [--seconds 8] [--connections 64]

One `serve` process with the trivial endpoint mounted
(`proving.bench.ingress_serve`), a fresh schema, and the load from another
process (`proving.bench.loadgen`). Each round measures, in this
order, the highest rate (closed loop) of:

- trivial: POST /bench/trivial, same server and framework, no database;
- new: POST /v1/messages, every key new (key row, message row, outbox row);
- replay: POST /v1/messages with keys sent before (duplicate_ignored);

then p50/p99 in an open loop at half the new-key rate, for new keys and for
the trivial endpoint at that same rate. Figures are medians over the rounds,
each also as a ratio to the trivial endpoint measured in the same round, with
the lowest and highest round beside them.

Where the time goes, per request: the CPU the serve process used (from
/proc), the load generator (its own count over the measured seconds), and
this host's PostgreSQL processes (other work on the same server counts too). The
machine is printed with the figures: serve is one process (one uvicorn
worker) and shares the host's cores with the load generator and PostgreSQL.
Targets (issue 11): new keys >= 0.5 of trivial; p99 < 25 ms at half that rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

from consumers import Settings
from dedupe import migrate, quote_ident
from ingress.keys import ApiKeys
from proving.deadlines import ANSWER_S


def load(url: str, key: str, server: int | None = None, **options: Any) -> dict[str, Any]:
    """One loadgen process; its JSON line, with the CPU each side used per request."""
    spec = json.dumps({"url": url, "key": key, **options})
    serve_before, pg_before = _proc_cpu(server), _postgres_cpu()
    out = subprocess.run(
        [sys.executable, "-m", "proving.bench.loadgen", spec],
        capture_output=True,
        text=True,
        check=True,
        timeout=float(options["seconds"]) + 120,
    )
    serve_after, pg_after = _proc_cpu(server), _postgres_cpu()
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    done = max(1, int(result["requests"]))
    result["serve_us"] = round((serve_after - serve_before) / done * 1e6, 1)
    result["loadgen_us"] = round(result["cpu_seconds"] / done * 1e6, 1)
    pg = sum(t - pg_before[pid] for pid, t in pg_after.items() if pid in pg_before)
    result["postgres_us"] = round(pg / done * 1e6, 1)
    return result


def _proc_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # gone, or no /proc here
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postgres_cpu() -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL process of this host (none without /proc)."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if (entry / "comm").read_text().strip() == "postgres":
                found[int(entry.name)] = _proc_cpu(int(entry.name))
        except OSError:
            continue
    return found


def start_serve(env: dict[str, str], log: Path, lanes: int) -> tuple[subprocess.Popen[bytes], str]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "proving.bench.ingress_serve",
                "--port",
                "0",
                "--queue",
                "bench.ingress",
                "--lanes",
                str(lanes),
            ],
            env=env,
            stdout=out,
            stderr=out,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://\S+)", log.read_text())
        if found:
            return proc, found[1]
        if proc.poll() is not None:
            raise SystemExit(f"serve exited: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    raise SystemExit("serve did not listen within 60 s")


async def prepare(settings: Settings, schema: str) -> str:
    conn = await asyncpg.connect(settings.database.url, timeout=ANSWER_S)
    try:
        await migrate(conn, schema)
        return await ApiKeys(schema).create(conn, "bench")
    finally:
        await conn.close()


async def drop(settings: Settings, schema: str) -> None:
    conn = await asyncpg.connect(settings.database.url, timeout=ANSWER_S)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S)
    finally:
        await conn.close()


def one_round(
    url: str, key: str, server: int, n: int, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    common = {"seconds": args.seconds, "connections": args.connections, "server": server}
    prefix = f"r{n}-{uuid.uuid4().hex[:6]}"
    out = {
        "trivial": load(url, key, mode="closed", kind="trivial", **common),
        "new": load(url, key, mode="closed", kind="new", prefix=prefix, **common),
        "replay": load(url, key, mode="closed", kind="replay", prefix=prefix, **common),
    }
    half = round(out["new"]["rate"] / 2, 1)
    out["new_open"] = load(
        url, key, mode="open", kind="new", rate=half, prefix=f"{prefix}-open", **common
    )
    out["trivial_open"] = load(url, key, mode="open", kind="trivial", rate=half, **common)
    for name, result in out.items():
        print(f"bench-ingress: round {n} {name}: {json.dumps(result)}", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.ingress")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--lanes", type=int, default=2)
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    schema = f"bench_ingress_{uuid.uuid4().hex[:8]}"
    key = asyncio.run(prepare(settings, schema))
    env = {**os.environ, "DATABASE_URL": settings.database.url, "DATABASE_SCHEMA": schema}
    log = Path(tempfile.mkdtemp(prefix="iw-bench-ingress-")) / "serve.log"
    started_load = os.getloadavg()
    proc, url = start_serve(env, log, args.lanes)
    try:
        load(url, key, mode="closed", kind="new", seconds=2, prefix="warmup")  # JIT-free warm-up
        rounds = [one_round(url, key, proc.pid, n, args) for n in range(1, args.rounds + 1)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        asyncio.run(drop(settings, schema))
    report(rounds)
    print(
        f"bench-ingress: machine cores={os.cpu_count()} serve=1 process (1 uvicorn worker,"
        f" {args.lanes} commit lanes) loadgen=1 process, {args.connections} connections;"
        " PostgreSQL on the same host unless DATABASE_URL says otherwise; load average"
        f" {_loads(started_load)} at start, {_loads(os.getloadavg())} at end"
    )
    return 0


def _loads(averages: tuple[float, float, float]) -> str:
    return "/".join(f"{a:.2f}" for a in averages)


def report(rounds: list[dict[str, dict[str, Any]]]) -> None:
    def med(name: str, field: str) -> float:
        return float(statistics.median(r[name][field] for r in rounds))

    def ratio(name: str) -> float:
        return float(statistics.median(r[name]["rate"] / r["trivial"]["rate"] for r in rounds))

    bad = {
        name: r[name]["statuses"]
        for r in rounds
        for name in r
        if set(r[name]["statuses"]) - {"202"} or r[name]["errors"]
    }

    def spread(name: str, field: str, digits: int = 0) -> str:
        values = [r[name][field] for r in rounds]
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}"

    def ratios(name: str) -> str:
        values = [r[name]["rate"] / r["trivial"]["rate"] for r in rounds]
        return f"{min(values):.2f}-{max(values):.2f}"

    print()
    print(
        f"{'':<28}{'req/s':>10}{'x trivial':>11}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'serve us':>10}{'loadgen us':>12}{'postgres us':>13}"
    )
    rows = (
        ("trivial", "trivial 202 (no database)"),
        ("new", "new keys"),
        ("replay", "replays (same key, body)"),
        ("new_open", "new keys, open loop"),
        ("trivial_open", "trivial, open loop"),
    )
    for name, label in rows:
        closed = not name.endswith("_open")
        print(
            f"{label:<28}{med(name, 'rate'):>10.0f}"
            f"{f'{ratio(name):.2f}' if closed else '':>11}"
            f"{med(name, 'p50_ms'):>9.1f}{med(name, 'p99_ms'):>9.1f}"
            f"{med(name, 'serve_us'):>10.0f}{med(name, 'loadgen_us'):>12.0f}"
            f"{med(name, 'postgres_us'):>13.0f}"
        )
    print(f"{'spread (lowest-highest round)':<28}")
    for name, label in rows:
        closed = not name.endswith("_open")
        print(
            f"{label:<28}{spread(name, 'rate'):>12}{ratios(name) if closed else '':>11}"
            f"{spread(name, 'p50_ms', 1):>11}{spread(name, 'p99_ms', 1):>12}"
        )
    print("(serve, loadgen, postgres us: CPU microseconds per request, median of the rounds)")
    new_ratio, p99 = ratio("new"), med("new_open", "p99_ms")
    print()
    print(
        f"bench-ingress: rounds={len(rounds)} trivial_rps={med('trivial', 'rate'):.0f} "
        f"new_rps={med('new', 'rate'):.0f} new_ratio={new_ratio:.2f} "
        f"replay_rps={med('replay', 'rate'):.0f} replay_ratio={ratio('replay'):.2f} "
        f"open_rate={med('new_open', 'rate'):.0f} open_p50_ms={med('new_open', 'p50_ms'):.1f} "
        f"open_p99_ms={p99:.1f} target_ratio={'met' if new_ratio >= 0.5 else 'missed'} "
        f"target_p99={'met' if p99 < 25 else 'missed'} unexpected_statuses={bad or 'none'}"
    )


if __name__ == "__main__":
    sys.exit(main())
