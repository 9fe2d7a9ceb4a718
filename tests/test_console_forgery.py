"""Forged actions over real HTTP: refused (403), nothing replayed, archived or audited.

The operator is signed in (the session cookie of `/login`, as a browser
holds it); the forger makes that browser send a form. The page's own
button, posted from the console's own origin, still acts, once.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aio_pika
import httpx
import pytest

from console import Role, Tokens
from console.origin import origin_of
from consumers import Settings
from dedupe import DbConnection
from tests.console_support import (
    console_in_process,
    held,
    intent_in,
    make_tokens,
    replayed_nothing,
    signed_in,
    two_dead_letters,
)

EVIL = "http://evil.example"


@dataclass(frozen=True, slots=True, kw_only=True)
class Scene:
    url: str
    queue: str
    olivia: httpx.AsyncClient  # the operator's browser: her session cookie
    olivia_token: str
    oscar: httpx.AsyncClient  # another operator, signed in elsewhere


@pytest.fixture
async def scene(
    db: DbConnection,
    schema: str,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
) -> AsyncIterator[Scene]:
    await two_dead_letters(channel, settings, queue_name)
    tokens = await make_tokens(db, schema)
    oscar = await Tokens(schema).create(db, "oscar", Role.OPERATOR)
    async with console_in_process(settings, queue_name) as url:
        olivia_http = await signed_in(url, tokens.operator)
        oscar_http = await signed_in(url, oscar)
        try:
            yield Scene(
                url=url,
                queue=queue_name,
                olivia=olivia_http,
                olivia_token=tokens.operator,
                oscar=oscar_http,
            )
        finally:
            await olivia_http.aclose()
            await oscar_http.aclose()


async def dry_run_key(http: httpx.AsyncClient, queue: str, **filters: str) -> str:
    page = await http.get("/replay", params={"queue": queue, **filters})
    assert page.status_code == 200, page.text
    return intent_in(page.text)


Forgery = Callable[[Scene], Awaitable[httpx.Response]]


async def unknown_key(scene: Scene) -> httpx.Response:
    form = {"queue": scene.queue, "intent": secrets.token_urlsafe(18)}
    return await scene.olivia.post("/replay", data=form)


async def key_of_another_sign_in(scene: Scene) -> httpx.Response:
    """The same operator's token, signed in a second time: another session."""
    elsewhere = await signed_in(scene.url, scene.olivia_token)
    try:
        key = await dry_run_key(elsewhere, scene.queue)
    finally:
        await elsewhere.aclose()
    return await scene.olivia.post("/replay", data={"queue": scene.queue, "intent": key})


async def key_of_another_operator(scene: Scene) -> httpx.Response:
    key = await dry_run_key(scene.oscar, scene.queue)
    return await scene.olivia.post("/replay", data={"queue": scene.queue, "intent": key})


async def key_of_the_archive_button(scene: Scene) -> httpx.Response:
    page = await scene.olivia.get("/archive", params={"queue": scene.queue})
    assert page.status_code == 200, page.text
    form = {"queue": scene.queue, "intent": intent_in(page.text)}
    return await scene.olivia.post("/replay", data=form)


async def key_of_another_selection(scene: Scene) -> httpx.Response:
    """The key of order-1's page, sent with no filter: every dead letter."""
    one = {"message_id": "order-1", "exact": "1"}
    key = await dry_run_key(scene.olivia, scene.queue, **one)
    return await scene.olivia.post("/replay", data={"queue": scene.queue, "intent": key})


def own_key_with(headers: dict[str, str | None]) -> Forgery:
    """The page's own key, the form sent with these Origin and Referer headers."""

    async def forged(scene: Scene) -> httpx.Response:
        key = await dry_run_key(scene.olivia, scene.queue)
        sent = {name: value for name, value in headers.items() if value is not None}
        request = scene.olivia.build_request(
            "POST", "/replay", data={"queue": scene.queue, "intent": key}, headers=sent
        )
        for name, value in headers.items():
            if value is None:
                del request.headers[name]
        return await scene.olivia.send(request)

    return forged


FORGERIES: dict[str, Forgery] = {
    "a key the console never rendered": unknown_key,
    "a key rendered for another sign-in of the same token": key_of_another_sign_in,
    "a key rendered for another operator": key_of_another_operator,
    "a key rendered for the archive button": key_of_the_archive_button,
    "a key rendered for another selection": key_of_another_selection,
    "a foreign Origin": own_key_with({"Origin": EVIL}),
    "the console's host on another port": own_key_with({"Origin": "http://127.0.0.1:1"}),
    "Origin: null": own_key_with({"Origin": "null"}),
    "a foreign Referer, no Origin": own_key_with({"Origin": None, "Referer": f"{EVIL}/x"}),
    "no Origin, no Referer": own_key_with({"Origin": None}),
}


@pytest.mark.parametrize("forgery", FORGERIES.values(), ids=FORGERIES.keys())
async def test_a_forged_replay_is_refused_and_changes_nothing(
    scene: Scene,
    forgery: Forgery,
    db: DbConnection,
    schema: str,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    answer = await forgery(scene)
    assert answer.status_code == 403, (answer.status_code, answer.text)
    assert "Nothing was done" in answer.text
    await replayed_nothing(db, schema, channel, scene.queue, 2)


async def test_the_pages_own_button_from_its_own_origin_replays_once_however_often_sent(
    scene: Scene, db: DbConnection, schema: str, channel: aio_pika.abc.AbstractChannel
) -> None:
    """The test above cannot pass by refusing everything: this form is the page's own."""
    key = await dry_run_key(scene.olivia, scene.queue)
    form = {"queue": scene.queue, "intent": key}
    for referer_only in (False, True, False):  # sent again after it acted: still once
        headers = {"Referer": f"{scene.url}/replay"}
        if referer_only:
            request = scene.olivia.build_request("POST", "/replay", data=form, headers=headers)
            del request.headers["Origin"]
            answer = await scene.olivia.send(request)
        else:
            answer = await scene.olivia.post("/replay", data=form, headers=headers)
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == f"/actions/{key}"
    assert await db.fetchval(f'SELECT count(*) FROM "{schema}".console_actions') == 1
    assert await held(channel, scene.queue) == 0
    work = await channel.declare_queue(scene.queue, passive=True)
    assert work.declaration_result.message_count == 2  # each once


async def test_a_forged_archive_is_refused_and_changes_nothing(
    scene: Scene, db: DbConnection, schema: str, channel: aio_pika.abc.AbstractChannel
) -> None:
    page = await scene.olivia.get("/archive", params={"queue": scene.queue})
    own = {"queue": scene.queue, "intent": intent_in(page.text), "confirm": "1"}
    dry = await dry_run_key(scene.olivia, scene.queue)
    forged = [
        ({**own, "intent": secrets.token_urlsafe(18)}, {}),
        ({**own, "intent": dry}, {}),  # the replay button's key
        (own, {"Origin": EVIL}),
        (own, {"Origin": "null"}),
    ]
    for form, headers in forged:
        answer = await scene.olivia.post("/archive", data=form, headers=headers)
        assert answer.status_code == 403, (form, headers, answer.text)
        await replayed_nothing(db, schema, channel, scene.queue, 2)
    done = await scene.olivia.post("/archive", data=own)
    assert done.status_code == 303 and await held(channel, scene.queue) == 0


async def test_sign_in_and_sign_out_from_a_foreign_origin_are_refused(scene: Scene) -> None:
    """Login CSRF (signing the operator in as someone else) and a forced sign-out."""
    forger = httpx.AsyncClient(base_url=scene.url, headers={"Origin": EVIL})
    try:
        answer = await forger.post("/login", data={"token": scene.olivia_token})
        assert answer.status_code == 403 and "set-cookie" not in answer.headers
    finally:
        await forger.aclose()
    out = await scene.olivia.post("/logout", headers={"Origin": EVIL})
    assert out.status_code == 403 and "set-cookie" not in out.headers
    assert (await scene.olivia.get("/actions")).status_code == 200  # still signed in
    out = await scene.olivia.post("/logout")
    assert out.status_code == 303 and (await scene.olivia.get("/actions")).status_code == 303


def test_an_origin_is_compared_as_browsers_write_it() -> None:
    """Scheme, host and port; case and a default port do not matter; nothing else passes."""
    same = ("http://Console.Example", "http://console.example:80", "http://console.example/x?y")
    assert {origin_of(url) for url in same} == {"http://console.example"}
    assert origin_of("https://console.example:443") == "https://console.example"
    assert origin_of("http://[::1]:8300") == "http://[::1]:8300"
    for other in ("null", "", "file:///etc", "javascript:alert(1)", "http://h:99999", "http://"):
        assert origin_of(other) is None, other
