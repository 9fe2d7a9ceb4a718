"""A fast webhook receiver for the webhook bench, in a child process of its own.

A minimal ASGI app under uvicorn (httptools, no access log, no lifespan): it
reads each request whole, answers 204 after `latency` seconds, and counts the
requests and their distinct `webhook-id`s. It verifies nothing (its CPU would
set the pace, not the sender's): the signatures are the chaos profile's and the
tests' to check (`providers.fakes.webhooks.WebhookReceiver`). The bench talks to
it over a pipe: `count` (requests, distinct ids since the last `forget`), `forget`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
from multiprocessing.connection import Connection
from typing import Any

from proving.bench import schedstat

STARTUP_S = 60.0


class ReceiverProcess:
    """The receiver in a child process; `url` is where it listens."""

    def __init__(self, *, latency: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, theirs = context.Pipe()
        self._child = context.Process(target=_serve, args=(latency, theirs), daemon=True)
        self._child.start()
        theirs.close()  # its death is then EOFError here, not a wait forever
        if not self._pipe.poll(STARTUP_S):
            self._child.kill()
            raise RuntimeError(f"the webhook receiver did not start within {STARTUP_S:.0f} s")
        port: int = self._pipe.recv()
        self.url = f"http://127.0.0.1:{port}"

    def cpu(self) -> schedstat.CpuTimes | None:
        """The child's event loop thread: time on a CPU and waiting for one."""
        pid = self._child.pid
        return None if pid is None else schedstat.of_process(pid)

    def requests(self) -> tuple[int, int]:
        """(requests read, distinct webhook-ids among them) since the last `forget()`."""
        self._pipe.send("count")
        counts: tuple[int, int] = self._pipe.recv()
        return counts

    def forget(self) -> None:
        self._pipe.send("forget")
        self._pipe.recv()

    def __enter__(self) -> ReceiverProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pipe.send("stop")
        self._child.join(timeout=10)
        if self._child.is_alive():
            self._child.kill()


def _serve(latency: float, pipe: Connection) -> None:
    asyncio.run(_serve_until_told(latency, pipe))


async def _serve_until_told(latency: float, pipe: Connection) -> None:
    import uvicorn

    ids: set[bytes] = set()
    requests = 0

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal requests
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        requests += 1
        for name, value in scope["headers"]:
            if name == b"webhook-id":
                ids.add(value)
        if latency > 0:
            await asyncio.sleep(latency)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        interface="asgi3",
        http="httptools",
        lifespan="off",
        ws="none",
        log_config=None,
        access_log=False,
        # Longer than any pause between rounds: a kept connection is not closed under
        # a sender about to reuse it (both sides' default is 5 s, a race at the edge).
        timeout_keep_alive=120,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    async with asyncio.timeout(STARTUP_S):
        while not server.started:
            if serving.done():
                serving.result()  # a failed start raises here
            await asyncio.sleep(0.01)
    pipe.send(sock.getsockname()[1])
    loop = asyncio.get_running_loop()
    while (command := await loop.run_in_executor(None, pipe.recv)) != "stop":
        if command == "count":
            pipe.send((requests, len(ids)))
        elif command == "forget":
            requests = 0
            ids.clear()
            pipe.send(None)
    server.should_exit = True
    async with asyncio.timeout(STARTUP_S):
        await serving
