"""The pages that only read: dead letters by queue and reason, a filtered list, one message.

Each page with a button renders the button's intent key (`audit.new_intent`)
into it; the dry run and the archive confirmation are pages too, so their
URLs carry the key on to the button that acts.
"""

from __future__ import annotations

import datetime

from fastapi import FastAPI, Request
from fastapi.responses import Response

from console.audit import new_intent
from console.filters import BadFilter, Filters
from console.signin import operator_of
from console.state import Console
from console.views import read_queue, shown_copy, shown_sends, summarize
from consumers.commands.deadletters import NoSuchQueue, work_queue_of
from consumers.commands.replay import Replayed, database_claims, replay
from dedupe import DedupeKey, look_up


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
            intent=new_intent(),
            now=now,
        )

    @app.get("/message")
    async def message(request: Request, queue: str, message_id: str, tenant: str = "") -> Response:
        who = await operator_of(console, request)
        queue = work_queue_of(queue)
        try:
            found, held = await read_queue(await console.broker(), queue, console.console.scan)
        except NoSuchQueue:
            return _no_queue(console, request, queue)
        copies = [x for x in found if x.message_id == message_id and x.tenant == tenant]
        key = DedupeKey(consumer=queue, tenant=tenant, message_id=message_id)
        async with console.db().acquire() as conn:
            record = await look_up(conn, console.settings.database.schema, key)
        filters = Filters(message_id=message_id, tenant=tenant, exact=True)
        return console.page(
            request,
            "message.html",
            who=who,
            queue=queue,
            key=key,
            held=held,
            read=len(found),
            copies=[shown_copy(copy, record) for copy in copies],
            record=record,
            sends=shown_sends(record),
            filters=filters,
            intent=new_intent(),
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
            intent=intent or new_intent(),
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
            intent=intent or new_intent(),
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
        return console.page(request, "action.html", who=who, action=found)


def _no_queue(console: Console, request: Request, queue: str) -> Response:
    return console.page(
        request, "error.html", 404, title="No such queue", text=f"{queue} (or its DLQ)"
    )
