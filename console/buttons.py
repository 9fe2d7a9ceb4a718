"""The buttons that act: replay and archive, each once per intent key.

A POST passes, in this order, or is answered and nothing is done:

1. `console.origin`: sent from the console's own origin           else 403
2. a live token (`console.signin`) with the operator role           else 401, 403
3. the intent key its page was rendered with, for this sign-in,     else 403
   this button, this queue and these filters (`console.intents`)

Whether this request acted or another with the same key did, the answer is
the same: a redirect (303) to the action's audit page, so a refresh there
repeats nothing.
"""

from __future__ import annotations

import contextlib

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from console.actions import Intent, archive_once, replay_once
from console.filters import BadFilter, Filters
from console.intents import Button
from console.signin import NotAllowed, form_of, operator_of, session_of
from console.state import Console
from consumers.commands.deadletters import NoSuchQueue, work_queue_of
from consumers.commands.printable import printable

log = structlog.get_logger(__name__)


def install(app: FastAPI, console: Console) -> None:
    async def intent_of(request: Request, button: Button) -> Intent | Response:
        fields = await form_of(request)
        queue = work_queue_of(fields.get("queue", ""))
        try:
            filters = Filters.read(fields)
            selection = filters.selection()
        except BadFilter as exc:
            return console.page(request, "error.html", 400, title="Bad filter", text=str(exc))
        key = fields.get("intent", "")
        why = console.intents.refusal(  # 3.
            key, session=session_of(request), button=button, queue=queue, filters=filters
        )
        if why is not None:
            log.warning("console_action_refused", button=button.value, why=printable(why))
            return console.page(
                request,
                "error.html",
                403,
                title=f"Refused: not this page's {button} button",
                text=f"This {button} was refused: {why}. Nothing was done."
                " Open the page again and use its button.",
            )
        if button is Button.ARCHIVE and fields.get("confirm") != "1":
            return console.page(
                request, "error.html", 400, title="Not confirmed", text="Nothing was archived."
            )
        return Intent(key=key, queue=queue, selection=selection, described=filters.describe())

    @app.post("/replay")
    async def replay_button(request: Request) -> Response:
        who = await operator_of(console, request)
        if not who.may_act:
            raise NotAllowed
        intent = await intent_of(request, Button.REPLAY)
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
        intent = await intent_of(request, Button.ARCHIVE)
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
