"""Signing in with an operator token, and who a request is.

The token goes in a cookie (HttpOnly, SameSite=Strict: no other site's page
can send it along) or, for scripts, an `Authorization: Bearer` header. Every
request looks it up by its hash, so a revoked token stops working at once.
Each sign-in at /login also sets a random session cookie: the intent keys of
the pages it is shown are bound to that sign-in (`session_of`), so a key
rendered for another sign-in, even of the same token, acts on nothing.
A page asked for without one is sent to /login; a button pressed without
the operator role is refused (403) and nothing is done. A form is read up to
FORM_MAX_BYTES (413 past it, before the rest is read): /login reads one
before anyone is signed in.
"""

from __future__ import annotations

import hashlib
import secrets
import urllib.parse

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from console.state import SECURITY_HEADERS, Console
from console.tokens import Operator
from consumers.runtime.http_limits import BodyTooLarge, ClientGone, read_within

COOKIE = "iw_console"
SESSION_COOKIE = "iw_console_session"


class NotSignedIn(Exception):
    """The request carries no live token."""


class NotAllowed(Exception):
    """The token's role may not do this."""


def _bearer(request: Request) -> str | None:
    sent = request.headers.get("authorization", "")
    return sent[7:].strip() if sent.lower().startswith("bearer ") else None


def session_of(request: Request) -> str:
    """What the request's intent keys are bound to: its sign-in (the cookie's token and
    the session /login set beside it), or a script's bearer token."""
    bearer = _bearer(request)
    if bearer is not None:
        seen = f"bearer\0{bearer}"
    else:
        seen = (
            f"cookie\0{request.cookies.get(COOKIE, '')}\0{request.cookies.get(SESSION_COOKIE, '')}"
        )
    return hashlib.sha256(seen.encode("utf-8", "surrogateescape")).hexdigest()


async def operator_of(console: Console, request: Request) -> Operator:
    bearer = _bearer(request)
    token = request.cookies.get(COOKIE, "") if bearer is None else bearer
    if not token:
        raise NotSignedIn
    async with console.db().acquire() as conn:
        found = await console.tokens.operator(conn, token)
    if found is None:
        raise NotSignedIn
    return found


# The console's forms hold a token, an intent key and a few filters: a few KiB.
FORM_MAX_BYTES = 65_536


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the last of a repeated one), at most FORM_MAX_BYTES.

    /login reads one before anyone is signed in, so its size is checked first:
    from Content-Length before a byte is read, and as a chunked body comes
    (`BodyTooLarge`, answered 413)."""
    body = (await read_within(request, FORM_MAX_BYTES)).decode("utf-8", "replace")
    return dict(urllib.parse.parse_qsl(body, keep_blank_values=True))


def install(app: FastAPI, console: Console) -> None:
    @app.exception_handler(NotSignedIn)
    async def not_signed_in(request: Request, exc: NotSignedIn) -> Response:
        if request.method == "GET":
            return RedirectResponse("/login", status_code=303)
        return console.page(request, "error.html", 401, title="Not signed in", text="Sign in.")

    @app.exception_handler(BodyTooLarge)
    async def form_too_large(request: Request, exc: BodyTooLarge) -> Response:
        answer = console.page(
            request,
            "error.html",
            413,
            title="Form too large",
            text=f"A form of the console holds at most {FORM_MAX_BYTES:,} bytes. Nothing was done.",
        )
        answer.headers["Connection"] = "close"  # the rest of the body is not read
        return answer

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's name; nobody reads it

    @app.exception_handler(NotAllowed)
    async def not_allowed(request: Request, exc: NotAllowed) -> Response:
        return console.page(
            request,
            "error.html",
            403,
            title="Not allowed",
            text="This token is read-only: it may not replay or archive. Nothing was done.",
        )

    @app.get("/login")
    async def login_page(request: Request) -> Response:
        return console.page(request, "login.html", error="")

    @app.post("/login")
    async def login(request: Request) -> Response:
        token = (await form_of(request)).get("token", "").strip()
        async with console.db().acquire() as conn:
            found = await console.tokens.operator(conn, token) if token else None
        if found is None:
            return console.page(request, "login.html", 401, error="No such token, or revoked.")
        answer = RedirectResponse("/", status_code=303, headers=SECURITY_HEADERS)
        answer.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
        session = secrets.token_urlsafe(18)
        answer.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict", path="/")
        return answer

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        answer = RedirectResponse("/login", status_code=303)
        for name in (COOKIE, SESSION_COOKIE):
            answer.delete_cookie(name, path="/")
        return answer
