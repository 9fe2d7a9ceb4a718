"""`/metrics`, `/healthz` and `/readyz` on one port (IW_METRICS_PORT), from a thread.

The standard library's WSGI server (wsgiref, one thread per request) in a
daemon thread; `/metrics` is prometheus-client's own WSGI app (content
negotiation, gzip); the probes answer 200 or 503 with one line of text
saying why. Nothing here parses HTTP, and nothing here waits on the event
loop: the probes read what `consumers.telemetry.health` last wrote.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import make_wsgi_app
from prometheus_client.registry import Collector

from consumers.telemetry.health import HealthView, Status

log = structlog.get_logger(__name__)

METRICS_PATH = "/metrics"
LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Probes every few seconds would flood the log; errors still reach the server."""


class Endpoint:
    """Serves `registry` and `health` on host:port; port 0 picks a free one."""

    def __init__(self, registry: Collector, health: HealthView, *, host: str, port: int) -> None:
        self._metrics = make_wsgi_app(registry)
        self._health = health
        self._server = make_server(
            host, port, self._app, server_class=_Server, handler_class=_QuietHandler
        )
        self.port: int = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"endpoint:{self.port}", daemon=True
        )

    def start(self) -> Endpoint:
        self._thread.start()
        log.info(
            "endpoint_serving", port=self.port, paths=[METRICS_PATH, LIVENESS_PATH, READINESS_PATH]
        )
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == METRICS_PATH:
            body: Iterable[bytes] = self._metrics(environ, start_response)
            return body
        if path == LIVENESS_PATH:
            return _answer(self._health.liveness(), start_response)
        if path == READINESS_PATH:
            return _answer(self._health.readiness(), start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]


def _answer(status: Status, start_response: StartResponse) -> list[bytes]:
    code = "200 OK" if status.ok else "503 Service Unavailable"
    start_response(code, [("Content-Type", "text/plain; charset=utf-8")])
    return [f"{'ok' if status.ok else 'not ok'}: {status.detail}\n".encode()]
