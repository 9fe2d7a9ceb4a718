"""Rows are written and locked in one order by every worker, or two batches deadlock.

The ledger sorts by a flat tuple (compared in C) instead of `TargetKey`'s own
dataclass order (compared through `__lt__`): the two must never disagree.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dedupe import DedupeKey, TargetKey
from dedupe.ledger import _lock_order

_text = st.text(max_size=6)
_targets = st.builds(
    TargetKey,
    key=st.builds(DedupeKey, consumer=_text, tenant=_text, message_id=_text),
    target_index=st.integers(min_value=0, max_value=2**31 - 1),
)


@given(st.lists(_targets, max_size=40))
def test_the_flat_order_is_the_keys_own(targets: list[TargetKey]) -> None:
    assert sorted(targets, key=_lock_order) == sorted(targets)
