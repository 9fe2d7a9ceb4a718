"""The console's FastAPI app: its state opened and closed with it, and its routes.

The pages are in `console.pages` (read only), the buttons in
`console.buttons`, the sign-in in `console.signin`; every request that is not
a GET passes `console.origin`'s check first. Every page is plain
HTML rendered on the server: no build chain, no CDN; it reads without
JavaScript, and `console.js` only disables a button while its form is pending.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import asyncpg
from fastapi import Depends, FastAPI
from fastapi.responses import Response

from console import buttons, origin, pages, signin
from console.audit import Audit
from console.settings import ConsoleSettings
from console.state import Console, templates
from console.tokens import Tokens
from consumers.settings import Settings


def create_app(settings: Settings, console: ConsoleSettings) -> FastAPI:
    state = Console(
        settings=settings,
        console=console,
        templates=templates(),
        tokens=Tokens(settings.database.schema),
        audit=Audit(settings.database.schema),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.pool = await asyncpg.create_pool(settings.database.url, min_size=1, max_size=4)
        try:
            yield
        finally:
            await state.close()

    app = FastAPI(
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(origin.guard(console.origins))],
    )
    app.state.console = state
    static = resources.files("console").joinpath("static")
    for name, kind in (("console.css", "text/css"), ("console.js", "text/javascript")):
        body = static.joinpath(name).read_bytes()
        app.add_api_route(f"/{name}", _static(body, kind), methods=["GET"])
    origin.install(app, state)
    signin.install(app, state)
    pages.install(app, state)
    buttons.install(app, state)
    return app


def _static(body: bytes, kind: str) -> Any:
    async def serve() -> Response:
        return Response(body, media_type=kind, headers={"Cache-Control": "max-age=300"})

    return serve
