"""A local HTTP/1.1 server that answers from a script: for the client's retry table.

Each request takes the next step: `(status, headers, body)` is answered,
`HANG` never answers (the client times out), `CLOSE` drops the connection.
It records each request's headers and body.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

HANG = "hang"
CLOSE = "close"

Step = tuple[int, Mapping[str, str], Any] | str


@dataclass(slots=True)
class Seen:
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class ScriptedServer:
    steps: list[Step]
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _server: asyncio.Server | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:  # a hanging step's connection too
            writer.close()
        await asyncio.wait_for(self._server.wait_closed(), 30)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            while True:
                # unbounded: a server waits for its client's next request, and ends with it
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")[1:]
                headers = {
                    k.strip().lower(): v.strip()
                    for k, v in (line.split(":", 1) for line in lines if ":" in line)
                }
                body = await reader.readexactly(
                    int(headers.get("content-length", "0"))
                )  # unbounded: as above
                self.seen.append(Seen(headers=headers, body=body))
                step = self.steps.pop(0) if self.steps else CLOSE
                if step == HANG:
                    await asyncio.sleep(3600)
                if step == CLOSE or isinstance(step, str):
                    return
                status, extra, payload = step
                data = json.dumps(payload).encode()
                out = [f"HTTP/1.1 {status} X", f"content-length: {len(data)}"]
                out += ["content-type: application/json", *(f"{k}: {v}" for k, v in extra.items())]
                writer.write(("\r\n".join(out) + "\r\n\r\n").encode() + data)
                await writer.drain()  # unbounded: as above
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            return
        finally:
            writer.close()
