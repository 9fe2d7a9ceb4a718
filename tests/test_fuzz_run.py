"""The end-to-end fuzz, CI-sized: raw generated messages through a real worker process.

`python -m proving.fuzz --inputs 100000` is the full form. Its broker is a
private node it starts (some inputs crash a broker channel).
"""

from __future__ import annotations

from proving.fuzz import run_fuzz
from tests.conftest import DATABASE_URL


async def test_every_fuzzed_input_ends_as_one_effect_or_a_dead_letter_with_a_reason() -> None:
    outcome = await run_fuzz(DATABASE_URL, inputs=400, seed_value=7, deadline_s=90)
    assert outcome.crash_logs == []
    assert outcome.crashes == 0
    assert outcome.published + outcome.refused == 400
    assert outcome.unaccounted == 0
    assert outcome.without_reason == 0
    assert outcome.doubled == 0
    assert outcome.undecidable == 0
    assert outcome.effects > 0 and outcome.dead_lettered > 0  # both kinds were drawn
