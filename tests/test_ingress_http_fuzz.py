"""Every route of the send API fuzzed with raw requests, CI-sized: no answer of 500 or more.

`python -m proving.fuzz.http --inputs 10000` is the full form (10,000 to each route).
"""

from __future__ import annotations

import pytest

from consumers import Settings, WebhookSettings
from dedupe import DbConnection
from ingress.settings import IngressSettings
from proving.fuzz.http import made_endpoints, run_http_fuzz
from proving.fuzz.http_inputs import ROUTES
from tests.ingress_support import serve_in_process
from tests.webhook_support import KEY

INPUTS = 600


@pytest.mark.timeout(300)
@pytest.mark.parametrize("route", ROUTES)
async def test_raw_requests_get_no_5xx_while_the_database_is_up(
    db: DbConnection, settings: Settings, schema: str, route: str
) -> None:
    ingress = IngressSettings(
        queue="t.fuzz", webhook_queue="t.fuzz.webhooks", email_queue="t.fuzz.emails"
    )
    webhooks = WebhookSettings(secrets_keys=(KEY,))
    async with serve_in_process(db, settings.database, ingress, webhook_settings=webhooks) as s:
        ids = await made_endpoints(db, schema, "acme", KEY)
        count = await run_http_fuzz(
            s.url, s.key, inputs=INPUTS, seed_value=21, route=route, ids=ids
        )
    print(count.line())
    assert count.inputs == INPUTS
    assert count.server_errors == 0, count.line()
    accepted = 201 if route == "endpoints" else 202
    assert count.statuses[accepted] > 0 and count.statuses[400] > 0  # both kinds were drawn
