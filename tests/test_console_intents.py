"""Intent keys as functions: bound to the sign-in, the button, the queue and the filters, and
to the console process that made them; refused once older than their lifetime."""

from __future__ import annotations

from console.filters import Filters
from console.intents import LIFETIME, Button, Intents

ONE = Filters(message_id="order-1", exact=True)
T0 = 1_796_000_000.0


def made(intents: Intents) -> str:
    return intents.issue(session="s-1", button=Button.REPLAY, queue="orders", filters=ONE, now=T0)


def refusal(
    intents: Intents,
    key: str,
    *,
    session: str = "s-1",
    button: Button = Button.REPLAY,
    queue: str = "orders",
    filters: Filters = ONE,
    now: float = T0,
) -> str | None:
    return intents.refusal(
        key, session=session, button=button, queue=queue, filters=filters, now=now
    )


def test_a_key_acts_only_for_what_it_was_made_for() -> None:
    intents = Intents()
    key = made(intents)
    assert len(key) == 46 and refusal(intents, key, now=T0 + 60) is None
    assert refusal(intents, key, session="s-2") is not None
    assert refusal(intents, key, button=Button.ARCHIVE) is not None
    assert refusal(intents, key, queue="orders.b") is not None
    assert refusal(intents, key, filters=Filters(message_id="order-2", exact=True)) is not None
    assert refusal(intents, key, filters=Filters(message_id="order-1")) is not None  # any tenant
    assert refusal(Intents(), key) is not None  # another console process: another secret
    flipped = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert refusal(intents, flipped) is not None
    for shape in ("", "x" * 46, key + "x", "../" + key[3:]):
        assert refusal(intents, shape) is not None


def test_a_key_past_its_lifetime_is_refused_with_the_reason() -> None:
    intents = Intents()
    key = made(intents)
    assert refusal(intents, key, now=T0 + LIFETIME.total_seconds()) is None
    late = refusal(intents, key, now=T0 + LIFETIME.total_seconds() + 1)
    assert late is not None and "older than 12 hours" in late
