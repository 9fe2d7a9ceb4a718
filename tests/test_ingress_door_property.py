"""The door refuses what the worker refuses: a generated job is 400 at the door, or attempted.

Jobs drawn by hypothesis (valid ones, and ones with any field possibly wrong)
go to the real send API; what it answers 202 goes through the outbox relay to
a real push worker sending to the fake APNs and FCM servers. Every accepted
job must end with each device sent or failed by the provider, and no job
dead-lettered: a 202 is never a dead letter the door could have seen.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from consumers import Settings
from ingress.settings import IngressSettings
from providers.fakes.apns import FakeApns
from providers.fakes.fcm import FakeFcm
from proving.fuzz.http_inputs import push_jobs
from tests.harness import Harness
from tests.ingress_support import Served, serve_in_process
from tests.support import wait_for
from tests.test_ingress_push import relaying
from tests.test_push import push_app

JOBS = 40


def drawn_jobs(count: int, seed_value: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(st.one_of(push_jobs(odd=False), push_jobs(odd=True)))
    def collect(job: dict[str, Any]) -> None:
        found.append(job)

    seed(seed_value)(collect)()
    return found[:count]


@pytest.fixture
async def served(harness: Harness, settings: Settings) -> AsyncIterator[Served]:
    async with serve_in_process(
        harness.db, settings.database, IngressSettings(queue=harness.queue)
    ) as s:
        yield s


async def test_a_generated_job_is_refused_at_the_door_or_attempted_by_the_worker(
    harness: Harness, served: Served, fake_apns: FakeApns, fake_fcm: FakeFcm
) -> None:
    accepted: list[str] = []
    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(
        base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, timeout=30
    ) as http:
        for n, job in enumerate(drawn_jobs(JOBS, seed_value=22)):
            job.pop("idempotency_key", None)
            answer = await http.post(
                "/v1/messages",
                content=json.dumps(job).encode("utf-8", "surrogatepass"),
                headers={"Content-Type": "application/json", "Idempotency-Key": f"p-{n}"},
            )
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            assert answer.status_code in (202, 400), (job, answer.text)
            if answer.status_code == 202:
                accepted.append(answer.json()["id"])
        assert accepted and statuses.get(400), statuses  # both kinds were drawn
        async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)), relaying(harness):

            async def all_attempted() -> bool:
                for message in accepted:
                    view = (await http.get(f"/v1/messages/{message}")).json()
                    if view["devices"]["pending"] or view["status"] != "taken":
                        return False
                return True

            await wait_for(all_attempted, timeout=90)
            assert await harness.dead_letter_count() == 0
    print(f"door_property: jobs={JOBS} statuses={statuses} attempted={len(accepted)}")
