"""Only the console's own pages may change anything: every POST's Origin is checked.

As Django's and Rails' CSRF protection do it, for every request whose method
is not GET, HEAD or OPTIONS (replay, archive, sign-in, sign-out, and any
route added later: the check is the app's, not a route's):

1. `Origin` is sent          it must be the console's own origin; `null` (an
                             opaque origin: a sandboxed frame, a data: URL) never is
2. no `Origin`, a `Referer`  the Referer's origin must be the console's own
3. neither                   refused: every browser the console supports sends
                             Origin with a POST; a script sends it as a header

The console's own origin is the request's scheme and `Host` (what the
browser connected to), or one of `ConsoleSettings.origins` (behind a proxy
that rewrites Host). Its pages send `Referrer-Policy: same-origin`, which
keeps their own forms' Origin (under `no-referrer` a browser sends
`Origin: null`) and sends no Referer to another site.

A refused request is answered 403 before its body is read: nothing is
done, nothing is audited. This check and the intent key (`console.intents`)
are independent: a forged form needs to pass both.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Iterable

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import Response

from console.state import Console
from consumers.commands.printable import printable

log = structlog.get_logger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ForeignRequest(Exception):
    """A request that would change something, not sent by one of the console's pages."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def origin_of(url: str) -> str | None:
    """`scheme://host[:port]` of an http(s) URL, lower case, the default port left out."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if parts.scheme not in _DEFAULT_PORTS or not host:
        return None
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    shown = "" if port in (None, _DEFAULT_PORTS[parts.scheme]) else f":{port}"
    return f"{parts.scheme}://{host}{shown}"


def refusal(request: Request, trusted: frozenset[str]) -> str | None:
    """None if the request came from the console's own origin; else why it is refused."""
    own = set(trusted)
    host = request.headers.get("host")
    if host and (served := origin_of(f"{request.url.scheme}://{host}")):
        own.add(served)
    sent = request.headers.get("origin")
    if sent is not None:  # 1.
        if origin_of(sent) in own:
            return None
        return f"it was sent from another site (Origin: {sent[:200]})"
    referer = request.headers.get("referer")
    if referer is not None:  # 2.
        if origin_of(referer) in own:
            return None
        return f"it was sent from another site (Referer: {referer[:200]})"
    return "it says neither where it came from (no Origin) nor from which page (no Referer)"  # 3.


def guard(trusted: Iterable[str]) -> Callable[[Request], Awaitable[None]]:
    """The app's dependency: raise `ForeignRequest` for a foreign state-changing request."""
    origins = frozenset(found for url in trusted if (found := origin_of(url)) is not None)

    async def same_origin(request: Request) -> None:
        if request.method in SAFE_METHODS:
            return
        why = refusal(request, origins)
        if why is not None:
            raise ForeignRequest(why)

    return same_origin


def install(app: FastAPI, console: Console) -> None:
    @app.exception_handler(ForeignRequest)
    async def refused(request: Request, exc: ForeignRequest) -> Response:
        log.warning("console_request_refused", path=request.url.path, why=printable(exc.why))
        answer = console.page(
            request,
            "error.html",
            403,
            title="Refused: not sent by a page of this console",
            text=f"This request was refused: {exc.why}. Nothing was done."
            " Open the console's page again and use its button.",
        )
        answer.headers["Connection"] = "close"  # its body is not read
        return answer
