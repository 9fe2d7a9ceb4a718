"""The console in a real browser: Debian's Chromium, driven by Playwright.

Dead letters are made by the real worker (`tests.apps.effects`, which
rejects a message while its marker file exists), the pages are opened, and
a replay is double-clicked (two clicks in one frame) and submitted from two
tabs showing the same page: each time one replay, one effect, one audit row.
A form on another origin of the same host (same-site: its POST carries the
operator's SameSite=Strict cookie) is refused.
Screenshots go to `IW_SCREENSHOTS` (a folder; docs/console/ holds a set),
else to the test's tmp_path.
"""

from __future__ import annotations

import asyncio
import html
import os
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from consumers import Settings, dead_letter_queue
from consumers.pipeline.settle import DEAD_LETTERED_AT_HEADER
from dedupe import DbConnection
from tests.conftest import AMQP_URL, Spawn
from tests.console_support import console_in_process, effects_of, make_tokens, publish, wait_held
from tests.rawamqp import RawProperties, publish_raw
from tests.support import no_message_ready, wait_declared, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
EVIL_ID = "evil-\x1b[2J-\u202eelif.exe"
EVIL_TENANT = "acme\x1b[31m"
DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Scene:
    url: str
    queue: str
    operator: str  # its token
    shots: Path


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the screenshots go: IW_SCREENSHOTS, else the test's tmp_path."""
    folder = Path(os.environ.get("IW_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def chromium() -> str:
    assert Path(CHROMIUM).exists(), "apt-get install -y chromium chromium-driver (.ci/run does)"
    return CHROMIUM


@pytest.fixture
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture
async def scene(
    db: DbConnection,
    schema: str,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
    spawn: Spawn,
    tmp_path: Path,
    shots: Path,
) -> AsyncIterator[Scene]:
    """Seven dead letters: six by the worker (one without a message_id), one forged older
    than retention; the console."""
    marker = tmp_path / "held-back"
    marker.write_text("the worker rejects while this exists")
    spawn()
    await wait_declared(AMQP_URL, queue_name)
    held_back = {"reject_while": str(marker)}
    for n in (1, 2, 3):
        await publish(channel, queue_name, f"order-{n}", {"n": n, **held_back})
    evil = {"n": 4, "note": "<script>alert(1)</script> nul:\u0000 ansi:\x1b[1m", **held_back}
    await publish(channel, queue_name, EVIL_ID, evil, {"x-tenant": EVIL_TENANT})
    await publish(channel, queue_name, "poison-5", b'{"n": 5,')
    await wait_held(channel, queue_name, 5)
    marker.unlink()
    # order-3 sent again once the fault is gone: it commits, so its dead copy is a no-op now.
    await publish(channel, queue_name, "order-3", {"n": 3, **held_back})
    await wait_for(lambda: _effects_are(db, "order-3", 1), timeout=60)
    await channel.default_exchange.publish(
        aio_pika.Message(
            b'{"n": 6}',
            message_id="order-old",
            content_type="application/json",
            headers={"x-reason": "held_back", DEAD_LETTERED_AT_HEADER: _ms() - 8 * DAY_MS},
        ),
        routing_key=dead_letter_queue(queue_name),
    )
    await publish_raw(queue_name, b'{"n": 7}', url=AMQP_URL, properties=RawProperties())
    await wait_held(channel, queue_name, 7)
    tokens = await make_tokens(db, schema)
    async with console_in_process(settings, queue_name) as url:
        yield Scene(url=url, queue=queue_name, operator=tokens.operator, shots=shots)


def _ms() -> int:
    return int(time.time() * 1000)


async def _effects_are(db: DbConnection, message_id: str, n: int) -> bool:
    return await effects_of(db, message_id) == n


async def signed_in(browser: Browser, scene: Scene) -> tuple[BrowserContext, Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await page.goto(f"{scene.url}/")
    assert page.url.endswith("/login")
    await page.fill("input[name=token]", scene.operator)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{scene.url}/")
    return context, page


def message_url(scene: Scene, message_id: str, tenant: str = "") -> str:
    query = urllib.parse.urlencode(
        {"queue": scene.queue, "message_id": message_id, "tenant": tenant}
    )
    return f"{scene.url}/message?{query}"


async def audit_rows(db: DbConnection, schema: str) -> tuple[list[str], list[str]]:
    """The audit tables as SELECT prints them: actions, then their messages."""
    actions = await db.fetch(
        f"SELECT intent_key, action, actor, queue, selection, finished_at IS NOT NULL AS finished"
        f' FROM "{schema}".console_actions ORDER BY started_at'
    )
    messages = await db.fetch(
        f"SELECT intent_key, n, message_id, tenant, outcome, why"
        f' FROM "{schema}".console_action_messages ORDER BY intent_key, n'
    )
    shown = ([str(dict(r)) for r in actions], [str(dict(r)) for r in messages])
    print("console_actions:", *shown[0], sep="\n  ")
    print("console_action_messages:", *shown[1], sep="\n  ")
    return shown


async def test_pages_show_dead_letters_escaped_and_a_double_click_replays_once(
    browser: Browser, scene: Scene, db: DbConnection, schema: str
) -> None:
    context, page = await signed_in(browser, scene)
    assert await page.locator("text=held_back").count() >= 1
    await page.screenshot(path=scene.shots / "overview.png", full_page=True)

    await page.goto(f"{scene.url}/letters?queue={scene.queue}")
    assert await page.locator("table tr").count() >= 8  # a header and seven dead letters
    await page.screenshot(path=scene.shots / "letters.png", full_page=True)

    await page.click("text=(none)")  # the dead letter without a message_id opens too
    await page.wait_for_url("**/message?*digest=*")
    assert "missing_message_id" in await page.inner_text("main")
    await page.screenshot(path=scene.shots / "message-no-id.png", full_page=True)

    await page.goto(message_url(scene, EVIL_ID, EVIL_TENANT))
    escapes = await page.locator(".esc").all_inner_texts()
    assert {"\\x1b", "\\u202e"} <= set(escapes), escapes
    html = await page.content()
    assert "\x1b" not in html and "\u202e" not in html and "\x00" not in html
    assert "<script>alert(1)</script>" not in html  # shown as text, never as markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in await page.inner_html("#body-1")
    await page.screenshot(path=scene.shots / "message-escaped.png", full_page=True)

    await page.goto(message_url(scene, "order-3"))
    assert "already processed" in await page.inner_text("#verdict-1")
    await page.screenshot(path=scene.shots / "message-noop.png", full_page=True)

    await page.goto(f"{scene.url}/replay?queue={scene.queue}")
    plan = await page.inner_text("#plan")
    assert "be a duplicate: no-op" in plan and "be refused: past retention" in plan
    assert "run" in plan
    await page.screenshot(path=scene.shots / "dry-run.png", full_page=True)

    await page.goto(message_url(scene, "order-1"))
    await page.click("#dry-run")
    await page.wait_for_selector("#replay")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    # Two clicks in one frame, as a double click lands before the page can answer.
    await page.evaluate(
        "() => { const b = document.querySelector('#replay'); b.click(); b.click(); }"
    )
    await page.wait_for_url("**/actions/**")
    await wait_for(lambda: _effects_are(db, "order-1", 1), timeout=60)
    await wait_for(lambda: no_message_ready(AMQP_URL, scene.queue), timeout=30)
    await page.reload()
    assert "replayed" in await page.inner_text("#outcomes")
    await page.screenshot(path=scene.shots / "replayed.png", full_page=True)
    await page.click("#back-to-message")
    await page.wait_for_url("**/message?*message_id=order-1*")
    await page.click("#back-to-queue")
    await page.wait_for_url("**/letters?*")

    actions, messages = await audit_rows(db, schema)
    assert len(actions) == 1 and "'action': 'replay'" in actions[0]
    assert len(messages) == 1 and "'message_id': 'order-1'" in messages[0]
    assert "'outcome': 'replayed'" in messages[0]
    assert await effects_of(db, "order-1") == 1
    print(f"POST requests the double click sent: {len(posts)}")
    await context.close()


async def test_a_replay_submitted_from_two_tabs_replays_once(
    browser: Browser, scene: Scene, db: DbConnection, schema: str
) -> None:
    context, first = await signed_in(browser, scene)
    await first.goto(f"{scene.url}/letters?queue={scene.queue}&reason=held_back")
    await first.click("#dry-run")
    await first.wait_for_selector("#replay")
    second = await context.new_page()
    await second.goto(first.url)  # the same dry run, open in a second tab
    await second.wait_for_selector("#replay")
    same = [await tab.get_attribute("input[name=intent]", "value") for tab in (first, second)]
    assert same[0] == same[1]

    posts: list[str] = []
    context.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    await asyncio.gather(first.click("#replay"), second.click("#replay"))
    await asyncio.gather(first.wait_for_url("**/actions/**"), second.wait_for_url("**/actions/**"))
    assert len(posts) == 2, posts  # both tabs' forms reached the console

    async def each_once() -> bool:
        ids = ("order-1", "order-2", EVIL_ID)
        return [await effects_of(db, m) for m in ids] == [1, 1, 1]

    await wait_for(each_once, timeout=60)
    await wait_for(lambda: no_message_ready(AMQP_URL, scene.queue), timeout=30)
    await first.reload()
    await first.screenshot(path=scene.shots / "two-tabs.png", full_page=True)

    actions, messages = await audit_rows(db, schema)
    assert len(actions) == 1
    outcomes = sorted(m.split("'outcome': ")[1].split(",")[0] for m in messages)
    assert outcomes == ["'refused'"] + ["'replayed'"] * 4  # order-old is past retention
    for message_id in ("order-1", "order-2", "order-3", EVIL_ID):
        assert await effects_of(db, message_id) == 1, message_id
    await context.close()


async def test_a_form_on_another_origin_of_the_same_host_is_refused(
    browser: Browser, scene: Scene, db: DbConnection, schema: str
) -> None:
    """SameSite=Strict does not stop it (another port is the same site): the Origin check
    does, even with the operator's own intent key in the form."""
    context, page = await signed_in(browser, scene)
    await page.goto(message_url(scene, "order-1"))
    await page.click("#dry-run")
    await page.wait_for_selector("#replay")
    fields = await page.eval_on_selector_all(
        "#replay-form input[type=hidden]", "inputs => inputs.map(i => [i.name, i.value])"
    )
    hidden = "".join(
        f'<input type="hidden" name="{html.escape(n)}" value="{html.escape(v)}">' for n, v in fields
    )
    forged = (
        f'<form method="post" action="{scene.url}/replay">{hidden}</form>'
        "<script>document.forms[0].submit()</script>"
    )
    elsewhere = "http://127.0.0.1:9"  # never reached: the browser is given the page below
    await page.route(
        f"{elsewhere}/**", lambda route: route.fulfill(body=forged, content_type="text/html")
    )
    posts: list[tuple[str | None, str]] = []
    page.on(
        "request",
        lambda r: posts.append((r.headers.get("origin"), r.url)) if r.method == "POST" else None,
    )
    async with page.expect_response(f"{scene.url}/replay") as answered:
        await page.goto(f"{elsewhere}/forged")
    answer = await answered.value
    assert answer.status == 403, answer.status  # on main: 303, the replay done
    assert posts == [(elsewhere, f"{scene.url}/replay")]
    assert "Nothing was done" in await page.inner_text("main")
    await page.screenshot(path=scene.shots / "refused.png", full_page=True)
    actions, _ = await audit_rows(db, schema)
    assert actions == [] and await effects_of(db, "order-1") == 0

    await page.go_back()  # the console's own page and button: it acts
    await page.goto(f"{scene.url}/replay?{urllib.parse.urlencode(dict(fields))}")
    await page.click("#replay")
    await page.wait_for_url("**/actions/**")
    await wait_for(lambda: _effects_are(db, "order-1", 1), timeout=60)
    await context.close()
