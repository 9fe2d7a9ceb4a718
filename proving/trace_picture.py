"""`python -m proving.trace_picture OUT.png`: one send's trace, as the spans arrive, drawn.

It runs the send path as production does, each part a process of its own with
its OTEL_SERVICE_NAME (send-api, relay, worker), exporting over OTLP/HTTP to a
local receiver (`proving.otlp`, decoding opentelemetry-proto): a push worker
(`app` below) against the local fake APNs and FCM, the outbox relay, the send
API; then one `curl` POST with a `traceparent`. The trace's spans are drawn as
a waterfall (an HTML page, rendered by Debian's chromium through Playwright)
into OUT.png, and listed on stdout. A fresh schema and queue, dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import aio_pika
import asyncpg

from consumers import App, Settings
from dedupe import migrate, quote_ident
from providers import Provider
from proving.deadlines import ANSWER_S, within
from proving.otlp import ExportedSpan, OtlpReceiver, start_receiver

QUEUE = "trace-picture.notifications"
HERE = Path(__file__).resolve().parents[1]

app = App()


async def _fakes() -> Provider:
    from providers.fakes.env import router_from_env

    return router_from_env(os.environ, "TRACE_", timeout_seconds=5.0)


app.push_handler(QUEUE, provider=_fakes)


def _start(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "consumers", *args],
        env=env,
        cwd=HERE,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each (a clean stop flushes its spans), then wait for it, 30 s at most."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _wait(what: str, check: object, seconds: float = 60.0) -> None:
    assert callable(check)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await check():
        if loop.time() > deadline:
            raise SystemExit(f"trace_picture: {what} not within {seconds:g} s")
        await asyncio.sleep(0.1)


def waterfall(spans: list[ExportedSpan]) -> str:
    """The trace as an HTML waterfall: a row per span, its service, its bar in time."""
    start = min(s.start_ns for s in spans)
    end = max(s.end_ns for s in spans)
    total = max(end - start, 1)
    colours = {"send-api": "#4c78a8", "relay": "#f58518", "worker": "#54a24b"}
    depth: dict[str, int] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        depth[span.span_id] = depth.get(span.parent_span_id, -1) + 1
    rows = []
    for span in sorted(spans, key=lambda s: (s.start_ns, depth[s.span_id])):
        left = (span.start_ns - start) / total * 100
        width = max((span.end_ns - span.start_ns) / total * 100, 0.3)
        shown = {
            k: v
            for k, v in span.attributes.items()
            if k.startswith(("idempotent_workers.", "messaging.message.id", "http.route"))
        }
        detail = ", ".join(f"{k.removeprefix('idempotent_workers.')}={v}" for k, v in shown.items())
        rows.append(
            "<tr>"
            f"<td class=svc style='color:{colours.get(span.service, '#666')}'>"
            f"{html.escape(span.service)}</td>"
            f"<td style='padding-left:{depth[span.span_id] * 14}px'>{html.escape(span.name)}"
            f" <span class=kind>{span.kind}</span><div class=attrs>{html.escape(detail)}</div></td>"
            f"<td class=lane><div class=bar style='left:{left:.2f}%;width:{width:.2f}%;"
            f"background:{colours.get(span.service, '#999')}'></div></td>"
            f"<td class=ms>{(span.end_ns - span.start_ns) / 1e6:.1f} ms</td></tr>"
        )
    return (
        "<!doctype html><meta charset=utf-8><style>"
        "body{font:13px system-ui,sans-serif;margin:16px;color:#222}"
        "table{border-collapse:collapse;width:1180px}"
        "td{padding:3px 6px;border-bottom:1px solid #eee;vertical-align:top}"
        ".svc{width:70px;font-weight:600}.kind{color:#888;font-size:11px}"
        ".attrs{color:#666;font-size:11px;font-family:monospace;max-width:520px;overflow-wrap:anywhere}"
        ".lane{position:relative;width:380px}.bar{position:absolute;top:6px;height:12px;border-radius:2px}"
        ".ms{text-align:right;width:70px;font-variant-numeric:tabular-nums}</style>"
        f"<h3>trace {spans[0].trace_id}: {len(spans)} spans, {total / 1e6:.1f} ms,"
        " POST /v1/messages to the APNs answer</h3>"
        f"<table>{''.join(rows)}</table>"
    )


def render(page: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False) as f:
        f.write(page)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        tab = browser.new_page(viewport={"width": 1220, "height": 400})
        tab.goto(Path(f.name).as_uri())
        tab.screenshot(path=str(out), full_page=True)
        browser.close()


async def picture(out: Path) -> int:
    from providers.fakes.apns import FakeApns
    from providers.fakes.env import fakes_env
    from providers.fakes.fcm import FakeFcm

    settings = Settings.from_env()
    schema = f"trace_picture_{secrets.token_hex(4)}"
    receiver: OtlpReceiver = start_receiver()
    work = Path(tempfile.mkdtemp(prefix="iw-trace-"))
    admin = await asyncpg.connect(settings.database.url, timeout=ANSWER_S)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await migrate(admin, schema)
        from ingress.keys import ApiKeys

        key = await ApiKeys(schema).create(admin, "acme")
        async with FakeApns() as apns, FakeFcm() as fcm:
            base = {
                **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
                **fakes_env(apns, fcm, work, "TRACE_"),
                "DATABASE_SCHEMA": schema,
                "PYTHONPATH": str(HERE),
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "200",
            }
            port = 18000 + secrets.randbelow(2000)
            procs.append(
                _start(
                    ["run", "proving.trace_picture:app"],
                    {**base, "OTEL_SERVICE_NAME": "worker"},
                    work / "worker.log",
                )
            )
            procs.append(
                _start(["relay"], {**base, "OTEL_SERVICE_NAME": "relay"}, work / "relay.log")
            )
            procs.append(
                _start(
                    ["serve", "--port", str(port), "--queue", QUEUE],
                    {**base, "OTEL_SERVICE_NAME": "send-api"},
                    work / "serve.log",
                )
            )

            async def up() -> bool:
                probe = await asyncio.create_subprocess_exec(
                    "curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/openapi.json"
                )
                return await within(ANSWER_S, "curl's probe", probe.wait()) == 0

            await _wait("the send API", up)

            async def consuming() -> bool:
                try:
                    connection = await aio_pika.connect(settings.amqp.url, timeout=ANSWER_S)
                except Exception:
                    return False
                try:
                    channel = await within(ANSWER_S, "a channel", connection.channel())
                    queue = await within(
                        ANSWER_S, "the queue", channel.declare_queue(QUEUE, passive=True)
                    )
                    return bool(queue.declaration_result.consumer_count)
                except aio_pika.exceptions.ChannelNotFoundEntity:
                    return False
                finally:
                    await connection.close()

            await _wait("the worker's consumer", consuming)
            trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
            body = {
                "targets": [{"platform": "ios", "token": "a1b2c3d4e5f6a7b8c9d0"}],
                "notification": {"title": "Shipped", "body": "Order 1042 is on its way"},
                "idempotency_key": "order-1042-shipped",
            }
            post = await asyncio.create_subprocess_exec(
                "curl", "-sS", "-H", f"Authorization: Bearer {key}",
                "-H", "Content-Type: application/json",
                "-H", f"traceparent: 00-{trace_id}-{parent}-01",
                "--data-binary", json.dumps(body), f"http://127.0.0.1:{port}/v1/messages",
            )  # fmt: skip
            await within(ANSWER_S, "curl's POST", post.wait())

            async def sent() -> bool:
                return any(s.name == "send apns" for s in receiver.traced(trace_id))

            await _wait("the send's span", sent)
            _stop(procs)  # each flushes its spans as it exits
        spans = receiver.traced(trace_id)
        for span in sorted(spans, key=lambda s: s.start_ns):
            print(f"{span.service:8} {span.kind:8} {span.name}")
        await asyncio.to_thread(render, waterfall(spans), out)  # Playwright's sync API
        print(f"trace_picture: {len(spans)} spans of trace {trace_id} drawn into {out}")
        return 0
    finally:
        _stop(procs)
        await admin.execute(
            f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S
        )
        await admin.close()
        receiver.server.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.trace_picture", description=__doc__)
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    return asyncio.run(picture(args.out))


if __name__ == "__main__":
    sys.exit(main())
