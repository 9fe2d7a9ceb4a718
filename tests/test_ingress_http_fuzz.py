"""POST /v1/messages fuzzed with raw requests, CI-sized: no answer of 500 or more.

`python -m proving.fuzz.http --inputs 10000` is the full form.
"""

from __future__ import annotations

from consumers import Settings
from dedupe import DbConnection
from ingress.settings import IngressSettings
from proving.fuzz.http import run_http_fuzz
from tests.ingress_support import serve_in_process

INPUTS = 600


async def test_raw_requests_get_no_5xx_while_the_database_is_up(
    db: DbConnection, settings: Settings
) -> None:
    async with serve_in_process(db, settings.database, IngressSettings(queue="t.fuzz")) as s:
        count = await run_http_fuzz(s.url, s.key, inputs=INPUTS, seed_value=21)
    print(count.line())
    assert count.inputs == INPUTS
    assert count.server_errors == 0, count.line()
    assert count.statuses[202] > 0 and count.statuses[400] > 0  # both kinds were drawn
