"""The pages that only read: dead letters by queue and reason, a filtered list, one message.

Each page with a button renders the button's intent key into it
(`console.intents`: one for replay, one for archive, bound to the sign-in,
the queue and the filters); the dry run and the archive confirmation are
pages too, so their URLs carry the key on to the button that acts, and two
tabs showing one of them hold one key. A carried key that is not valid for
the page (its filters edited in the URL, say) is replaced by a new one.

Every dead letter has a page: by its key (message_id and tenant) when it has
one a URL can hold, else by its digest (`DeadLetter.digest`, `views.letter_url`).
"""

from __future__ import annotations

import datetime

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from console.filters import BadFilter, Filters
from console.intents import Button
from console.signin import operator_of, session_of
from console.state import Console
from console.views import (
    addressable,
    audited_url,
    letter_url,
    read_queue,
    shown_copy,
    shown_sends,
    summarize,
)
from consumers.commands.deadletters import NoSuchQueue, work_queue_of
from consumers.commands.printable import printable
from consumers.commands.replay import Replayed, database_claims, replay
from dedupe import DedupeKey, KeyRecord, look_up


def install(app: FastAPI, console: Console) -> None:
    @app.get("/")
    async def overview(request: Request) -> Response:
        who = await operator_of(console, request)
        now = datetime.datetime.now(datetime.UTC)
        connection = await console.broker()
        views, missing = [], []
        for queue in console.console.queues:
            try:
                letters, held = await read_queue(connection, queue, console.console.scan)
            except NoSuchQueue:
                missing.append(queue)
                continue
            views.append(summarize(queue, letters, held, now))
        return console.page(request, "overview.html", who=who, views=views, missing=missing)

    @app.get("/letters")
    async def letters(request: Request, queue: str) -> Response:
        who = await operator_of(console, request)
        queue = work_queue_of(queue)
        try:
            filters = Filters.read(request.query_params)
            selection = filters.selection()
        except BadFilter as exc:
            return console.page(request, "error.html", 400, title="Bad filter", text=str(exc))
        try:
            found, held = await read_queue(await console.broker(), queue, console.console.scan)
        except NoSuchQueue:
            return _no_queue(console, request, queue)
        now = datetime.datetime.now(datetime.UTC)
        chosen = [x for x in found if selection.matches(x)][: selection.limit]
        return console.page(
            request,
            "letters.html",
            who=who,
            queue=queue,
            view=summarize(queue, chosen, held, now),
            letters=chosen,
            filters=filters,
            keys=_keys(console, request, queue, filters),
            letter_url=letter_url,
            now=now,
        )

    @app.get("/message")
    async def message(
        request: Request, queue: str, message_id: str = "", tenant: str = "", digest: str = ""
    ) -> Response:
        """One key's copies and its story in the database; or, by `digest`, one dead letter
        that has no key a URL can hold (no message_id, or one or a tenant not UTF-8)."""
        who = await operator_of(console, request)
        queue = work_queue_of(queue)
        if not message_id and not digest:
            text = "Say which: message_id (and tenant) or digest."
            return console.page(request, "error.html", 400, title="Which message?", text=text)
        try:
            found, held = await read_queue(await console.broker(), queue, console.console.scan)
        except NoSuchQueue:
            return _no_queue(console, request, queue)
        record: KeyRecord | None = None
        if digest:  # no key: no story in the database
            copies = [x for x in found if x.digest == digest]
            if copies:
                message_id, tenant = copies[0].message_id or "", copies[0].tenant
            filters = Filters(digest=digest)
        else:  # as the list links it, or as the audit prints it
            copies = [
                x
                for x in found
                if x.is_named(message_id) and tenant in (x.tenant, printable(x.tenant))
            ]
            if copies and not addressable(copies[0]):
                return RedirectResponse(letter_url(queue, copies[0]), status_code=303)
            if copies:
                message_id, tenant = copies[0].message_id or message_id, copies[0].tenant
            filters = Filters(message_id=message_id, tenant=tenant, exact=True)
            key = DedupeKey(consumer=queue, tenant=tenant, message_id=message_id)
            async with console.db().acquire() as conn:
                record = await look_up(conn, console.settings.database.schema, key)
        return console.page(
            request,
            "message.html",
            who=who,
            queue=queue,
            message_id=message_id,
            tenant=tenant,
            digest=digest,
            held=held,
            read=len(found),
            copies=[shown_copy(copy, record) for copy in copies],
            record=record,
            sends=[] if record is None else shown_sends(record),
            filters=filters,
            keys=_keys(console, request, queue, filters),
        )

    @app.get("/replay")
    async def dry_run(request: Request, queue: str, intent: str = "") -> Response:
        """The dry run of a replay: what each message would do; the button that replays."""
        who = await operator_of(console, request)
        queue = work_queue_of(queue)
        try:
            filters = Filters.read(request.query_params)
            selection = filters.selection()
        except BadFilter as exc:
            return console.page(request, "error.html", 400, title="Bad filter", text=str(exc))
        outcomes: list[Replayed] = []
        async with console.db().acquire() as conn:
            try:
                summary = await replay(
                    await console.broker(),
                    queue,
                    selection,
                    retention=console.settings.retention.keep,
                    force=False,
                    dry_run=True,
                    most=console.console.scan,
                    report=outcomes.append,
                    claims=database_claims(conn, console.settings.database.schema),
                )
            except NoSuchQueue:
                return _no_queue(console, request, queue)
        return console.page(
            request,
            "replay.html",
            who=who,
            queue=queue,
            filters=filters,
            outcomes=outcomes,
            summary=summary,
            intent=_key(console, request, Button.REPLAY, queue, filters, carried=intent),
        )

    @app.get("/archive")
    async def confirm_archive(request: Request, queue: str, intent: str = "") -> Response:
        who = await operator_of(console, request)
        queue = work_queue_of(queue)
        try:
            filters = Filters.read(request.query_params)
            selection = filters.selection()
        except BadFilter as exc:
            return console.page(request, "error.html", 400, title="Bad filter", text=str(exc))
        try:
            found, held = await read_queue(await console.broker(), queue, console.console.scan)
        except NoSuchQueue:
            return _no_queue(console, request, queue)
        chosen = [x for x in found if selection.matches(x)][: selection.limit]
        return console.page(
            request,
            "archive.html",
            who=who,
            queue=queue,
            filters=filters,
            letters=chosen,
            held=held,
            intent=_key(console, request, Button.ARCHIVE, queue, filters, carried=intent),
        )

    @app.get("/actions")
    async def actions(request: Request) -> Response:
        who = await operator_of(console, request)
        async with console.db().acquire() as conn:
            recent = await console.audit.recent(conn)
        return console.page(request, "actions.html", who=who, actions=recent)

    @app.get("/actions/{intent}")
    async def action(request: Request, intent: str) -> Response:
        who = await operator_of(console, request)
        async with console.db().acquire() as conn:
            found = await console.audit.find(conn, intent)
        if found is None:
            return console.page(request, "error.html", 404, title="No such action", text=intent)
        links = [audited_url(found.queue, one) for one in found.messages]
        back = links[0] if len(set(links)) == 1 else None  # it acted on one message
        rows = list(zip(found.messages, links, strict=True))
        return console.page(request, "action.html", who=who, action=found, rows=rows, back=back)


def _key(
    console: Console,
    request: Request,
    button: Button,
    queue: str,
    filters: Filters,
    *,
    carried: str = "",
) -> str:
    """The key the page's button carries: the one its URL brought, if made for this
    sign-in, button, queue and filters; else a new one."""
    session = session_of(request)
    if carried and (
        console.intents.refusal(
            carried, session=session, button=button, queue=queue, filters=filters
        )
        is None
    ):
        return carried
    return console.intents.issue(session=session, button=button, queue=queue, filters=filters)


def _keys(console: Console, request: Request, queue: str, filters: Filters) -> dict[str, str]:
    """A new key for each button a page links to: {"replay": ..., "archive": ...}."""
    return {button.value: _key(console, request, button, queue, filters) for button in Button}


def _no_queue(console: Console, request: Request, queue: str) -> Response:
    return console.page(
        request, "error.html", 404, title="No such queue", text=f"{queue} (or its DLQ)"
    )
