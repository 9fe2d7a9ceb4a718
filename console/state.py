"""What every request of the console uses: a pool, the broker, the templates, the audit,
the intent keys."""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import asyncpg
from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from console.audit import Audit
from console.escape import visible
from console.intents import Intents
from console.settings import ConsoleSettings
from console.tokens import Tokens
from consumers.broker.connection import connect_once
from consumers.commands.printable import printable
from consumers.settings import Settings

# What the pages may load: their own stylesheet and script, nothing else. A Referer
# only to the console itself: its own forms keep their Origin (`console.origin`).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self';"
        " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(slots=True, kw_only=True)
class Console:
    """What every request uses; one per app."""

    settings: Settings
    console: ConsoleSettings
    templates: Environment
    tokens: Tokens
    audit: Audit
    intents: Intents = field(default_factory=Intents)  # its secret: this process's own
    pool: asyncpg.Pool | None = None
    _broker: aio_pika.abc.AbstractConnection | None = None
    _connecting: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def broker(self) -> aio_pika.abc.AbstractConnection:
        """The broker connection, made again when it was lost."""
        async with self._connecting:
            if self._broker is None or self._broker.is_closed:
                self._broker = await connect_once(self.settings.amqp.urls)
            return self._broker

    def db(self) -> asyncpg.Pool:
        assert self.pool is not None, "the app's lifespan opens the pool"
        return self.pool

    def page(self, request: Request, name: str, status: int = 200, **values: Any) -> Response:
        html = self.templates.get_template(name).render(
            request=request, metrics_urls=self.console.metrics_urls, **values
        )
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    async def close(self) -> None:
        if self._broker is not None:
            await self._broker.close()
        if self.pool is not None:
            await self.pool.close()


def templates() -> Environment:
    env = Environment(
        loader=PackageLoader("console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["visible"] = visible  # in the page: escapes marked
    env.filters["printable"] = printable  # in the title: plain text, no markup
    env.filters["when"] = _when
    env.filters["duration"] = _duration
    return env


def _when(moment: datetime.datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(span: datetime.timedelta) -> str:
    seconds = span.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"
