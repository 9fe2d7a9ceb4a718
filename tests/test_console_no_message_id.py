"""Every dead letter opens, those without a usable message_id too.

The real worker dead-letters jobs published (raw AMQP: aio-pika would make
up an id) without a message_id (`missing_message_id`), with one that is not
UTF-8, and with an `x-tenant` that is not UTF-8, which no URL can hold as
text. The list links each one, its page shows it (escaped) and no other, and
the archive button of one takes that one only.
"""

from __future__ import annotations

import html
import json
import re

import aio_pika

from consumers import Settings
from dedupe import DbConnection
from tests.conftest import AMQP_URL, Spawn
from tests.console_support import (
    console_in_process,
    form_in,
    link_in,
    make_tokens,
    signed_in,
    wait_held,
)
from tests.rawamqp import RawProperties, publish_raw
from tests.support import wait_declared

LINK = re.compile(r'<a href="(/message\?[^"]+)">')


async def test_a_dead_letter_without_a_message_id_opens_from_the_list_and_archives_alone(
    db: DbConnection,
    schema: str,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
    spawn: Spawn,
) -> None:
    spawn()
    await wait_declared(AMQP_URL, queue_name)
    first = {"n": 1, "note": "<b>bold</b> ansi:\x1b[2J"}
    letters = [
        (json.dumps(first).encode(), RawProperties(headers={"x-tenant": "acme"})),
        (b'{"n": 2}', RawProperties(headers={"x-tenant": b"\xfe"})),
        (b'{"n": 3}', RawProperties(message_id=b"order-\xff")),
        (b'{"n": 4}', RawProperties(message_id="order-4", headers={"x-tenant": b"\xfe"})),
    ]
    for body, properties in letters:
        await publish_raw(queue_name, body, url=AMQP_URL, properties=properties)
    await wait_held(channel, queue_name, 4)
    tokens = await make_tokens(db, schema)
    async with console_in_process(settings, queue_name) as url:
        http = await signed_in(url, tokens.operator)
        try:
            listed = await http.get("/letters", params={"queue": queue_name})
            assert listed.status_code == 200, listed.text
            for reason in ("missing_message_id", "message_id_not_utf8", "tenant_not_utf8"):
                assert reason in listed.text
            links = [html.unescape(link) for link in LINK.findall(listed.text)]
            assert len(links) == 4, listed.text  # one per dead letter

            pages = [await http.get(link) for link in links]
            assert [page.status_code for page in pages] == [200] * 4
            for n in (1, 2, 3, 4):  # each page shows its own letter, and no other
                shown = [page for page in pages if f"&quot;n&quot;: {n}" in page.text]
                assert len(shown) == 1, n
            one = next(page for page in pages if "bold" in page.text)
            assert "&lt;b&gt;bold&lt;/b&gt;" in one.text and "<b>bold" not in one.text
            assert "ansi:\\u001b[2J" in one.text and "\x1b" not in one.text  # JSON's own escape
            assert "missing_message_id" in one.text
            for page in pages:
                if "&quot;n&quot;: 2" in page.text or "&quot;n&quot;: 4" in page.text:
                    assert '<span class="esc">\\xfe</span>' in page.text  # its tenant

            asked = await http.get(link_in(one.text, "archive"))
            assert asked.status_code == 200 and asked.text.count("missing_message_id") == 1
            assert "message_id_not_utf8" not in asked.text
            done = await http.post("/archive", data={**form_in(asked.text), "confirm": "1"})
            assert done.status_code == 303, done.text
            await wait_held(channel, queue_name, 3)  # the others stay
            kept = await db.fetch(f'SELECT body FROM "{schema}".console_action_messages')
            assert [bytes(r["body"]) for r in kept] == [json.dumps(first).encode()]
        finally:
            await http.aclose()
