"""The crash window the demo and the channel chaos count by (`proving.crash_window`).

A second arrival of one intent is allowed only when a killed worker held its row
`sending` and its call reached the receiver before that lease expired (or the
workers logged its answer as lost); anything else is counted beyond the window,
which fails the demo and the chaos run.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from dedupe import LEASE_EXPIRED, DbConnection, DedupeKey, SendIntent, SendLedger, TargetKey
from proving.crash_window import Death, Held, address_key, answers_lost, held_by, tally


def _held(address: str, expires_at: float) -> Held:
    return Held(consumer="q", channel="ios", address=address, effect_id="e", expires_at=expires_at)


def test_a_second_arrival_inside_a_dead_workers_lease_is_explained() -> None:
    death = Death(pid=1, at=10.0, held=(_held("a", expires_at=20.0),))
    found = tally({"a"}, {"a": [9.5, 25.0]}, [death], address_key)
    assert (found.delivered, found.duplicates, found.on_the_wire, found.beyond_window) == (
        1,
        1,
        1,
        0,
    )
    assert found.ok


def test_a_second_arrival_nobody_held_on_the_wire_is_beyond_the_window() -> None:
    # "b" was held, but its call never reached the receiver before the lease expired:
    # its two arrivals came later, so no kill explains the second.
    death = Death(pid=1, at=10.0, held=(_held("b", expires_at=20.0),))
    arrivals = {"a": [1.0, 2.0], "b": [21.0, 22.0]}
    found = tally({"a", "b"}, arrivals, [death], address_key)
    assert (found.duplicates, found.on_the_wire, found.beyond_window) == (2, 0, 2)
    assert not found.ok
    assert set(found.sample) == {"a", "b"}


def test_two_kills_holding_one_intent_count_once_each_only_for_arrivals_of_their_own() -> None:
    first = Death(pid=1, at=10.0, held=(_held("a", expires_at=20.0),))
    second = Death(pid=2, at=30.0, held=(_held("a", expires_at=40.0),))
    # The first kill's call arrived; the second worker had leased it, never called it.
    one_call = tally({"a"}, {"a": [9.0, 41.0]}, [first, second], address_key)
    assert (one_call.on_the_wire, one_call.beyond_window) == (1, 0)
    # Both kills had a call on the wire: three arrivals are explained.
    both = tally({"a"}, {"a": [9.0, 29.0, 41.0]}, [second, first], address_key)
    assert (both.on_the_wire, both.beyond_window) == (2, 0)
    # The same three arrivals, one kill: one too many.
    assert tally({"a"}, {"a": [9.0, 29.0, 41.0]}, [first], address_key).beyond_window == 1


def test_an_intent_that_never_arrived_is_lost_and_a_lost_answer_allows_one_resend() -> None:
    found = tally({"a", "b"}, {"b": [1.0, 2.0]}, [], address_key, lost_answers={"b": 1})
    assert (found.lost, found.lost_answers, found.beyond_window) == (1, 1, 0)
    assert not found.ok and found.sample == ("a",)


def test_rows_of_another_queue_are_not_keys_of_this_one() -> None:
    death = Death(pid=1, at=10.0, held=(_held("a", expires_at=20.0),))
    found = tally({"a"}, {"a": [9.0, 21.0]}, [death], lambda held: None)
    assert found.beyond_window == 1


async def test_held_by_reads_the_rows_a_worker_holds_sending_by_its_pid(
    db: DbConnection, schema: str
) -> None:
    def intents(message_id: str) -> list[SendIntent]:
        key = DedupeKey(consumer="q", tenant="acme", message_id=message_id)
        return [
            SendIntent(
                target=TargetKey(key=key, target_index=n),
                channel="webhook",
                address=f"ep_{message_id}_{n}",
                effect_id=str(uuid.uuid4()),
                collapse_id="c",
            )
            for n in range(3)
        ]

    await SendLedger(schema, "host:1234:ab12cd").open(db, intents("m1"), 30.0, leased=2)
    await SendLedger(schema, "host:12345:ef34ab").open(db, intents("m2"), 30.0)
    held = await held_by(db, 1234)
    # Its two leased targets (the third is only `claimed`), not pid 12345's rows.
    assert sorted(h.address for h in held) == ["ep_m1_0", "ep_m1_1"]
    # Their lease's end, on this process' clock: about 30 s from now.
    assert all(20.0 < h.expires_at - time.monotonic() <= 30.5 for h in held)
    assert {h.consumer for h in held} == {"q"}


def test_answers_lost_are_read_from_the_deferred_lines_but_not_a_lease_taken_over(
    tmp_path: Path,
) -> None:
    lines = [
        {"event": "webhook_deferred", "reason": "unknown_outcome: Timeout", "effect_id": "e1"},
        {"event": "push_deferred", "reason": "unknown_outcome: ReadError", "effect_id": "e1"},
        {"event": "push_deferred", "reason": LEASE_EXPIRED, "effect_id": "e2"},
        {"event": "push_deferred", "reason": "HTTP 503", "effect_id": "e3"},
    ]
    text = "\n".join(json.dumps(line) for line in lines)
    (tmp_path / "worker-0.log").write_text(text + '\n{"event":"push_deferred","reason":"unkno')
    assert answers_lost(tmp_path) == {"e1": 2}
