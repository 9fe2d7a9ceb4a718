"""The buttons that act: replay and archive, each once per intent key.

A POST needs the operator role (a read-only token gets 403 and nothing is
done) and the intent key its page was rendered with. Whether this request
acted or another with the same key did, the answer is the same: a redirect
(303) to the action's audit page, so a refresh there repeats nothing.
"""

from __future__ import annotations

import contextlib
import re

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from console.actions import Intent, archive_once, replay_once
from console.filters import BadFilter, Filters
from console.signin import NotAllowed, form_of, operator_of
from console.state import Console
from consumers.commands.deadletters import NoSuchQueue, work_queue_of

# What `audit.new_intent` makes; anything else never reaches the audit or a URL.
_INTENT = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def install(app: FastAPI, console: Console) -> None:
    async def intent_of(request: Request, *, confirmed: bool = False) -> Intent | Response:
        fields = await form_of(request)
        if confirmed and fields.get("confirm") != "1":
            return console.page(
                request, "error.html", 400, title="Not confirmed", text="Nothing was archived."
            )
        key = fields.get("intent", "")
        if not _INTENT.match(key):
            return console.page(
                request, "error.html", 400, title="No intent key", text="Open the page again."
            )
        try:
            filters = Filters.read(fields)
            selection = filters.selection()
        except BadFilter as exc:
            return console.page(request, "error.html", 400, title="Bad filter", text=str(exc))
        return Intent(
            key=key,
            queue=work_queue_of(fields.get("queue", "")),
            selection=selection,
            described=filters.describe(),
        )

    @app.post("/replay")
    async def replay_button(request: Request) -> Response:
        who = await operator_of(console, request)
        if not who.may_act:
            raise NotAllowed
        intent = await intent_of(request)
        if isinstance(intent, Response):
            return intent
        with contextlib.suppress(NoSuchQueue):  # recorded in the audit: the action page says so
            await replay_once(
                console.db(),
                await console.broker(),
                console.audit,
                intent,
                who,
                retention=console.settings.retention.keep,
                most=console.console.scan,
            )
        return RedirectResponse(f"/actions/{intent.key}", status_code=303)

    @app.post("/archive")
    async def archive_button(request: Request) -> Response:
        who = await operator_of(console, request)
        if not who.may_act:
            raise NotAllowed
        intent = await intent_of(request, confirmed=True)
        if isinstance(intent, Response):
            return intent
        with contextlib.suppress(NoSuchQueue):
            await archive_once(
                console.db(),
                await console.broker(),
                console.audit,
                intent,
                who,
                most=console.console.scan,
            )
        return RedirectResponse(f"/actions/{intent.key}", status_code=303)
