"""The job of an API channel: one AMQP message, one JSON object, one call.

    {"amount": 2000, "currency": "usd", "customer": "cus_1042"}

What the object holds is the API's own (`providers.IdempotentApi`): its class's
`validate(body)` refuses what it cannot take, at the send API's door and in the
worker alike (dead-lettered as `invalid_<name>_job`, the reason in `x-error`).
A job is one call, so one ledger row: channel the API's `name`, address the
body's `address_field` (the customer, the order the call acts on) or the API's
name. `ApiKind(PaymentsApi)` is the kind the send ledger's runner reads its
jobs through; `api_job_body(PaymentsApi, {...})` builds one on the publisher side.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import asyncpg

from consumers.jobs.kind import DeadTarget, InvalidJob, Recipient
from consumers.message.decisions import ConfigurationError
from consumers.settings import Settings
from dedupe import DbConnection
from providers.api_call import ApiCall

if TYPE_CHECKING:  # httpx (the `api` extra) loads with the sender, not with the kind
    from providers.idempotent_api import IdempotentApi

MAX_ADDRESS_CHARS = 1000
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiJob:
    body: Mapping[str, Any]
    address: str  # what the call acts on, as its ledger row shows


def parse_api_job(api: type[IdempotentApi], body: Mapping[str, Any]) -> ApiJob:
    """Parse and validate a job of `api`; raise `InvalidJob` saying what is wrong."""
    if not isinstance(body, Mapping):
        raise InvalidJob("the job: a JSON object is required")
    try:
        api.validate(body)
    except ValueError as exc:  # InvalidCall
        raise InvalidJob(str(exc) or type(exc).__name__) from None
    except (LookupError, TypeError) as exc:  # body["amount"] on a body without one
        raise InvalidJob(f"{type(exc).__name__}: {exc}") from None
    field = api.address_field
    if field is None:
        return ApiJob(body=body, address=api.name)
    value = body.get(field)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value or len(value) > MAX_ADDRESS_CHARS:
        raise InvalidJob(f"{field}: a string of 1 to {MAX_ADDRESS_CHARS} characters is required")
    if "\x00" in value:
        raise InvalidJob(f"{field}: no NUL (U+0000) character")
    return ApiJob(body=body, address=value)


def api_job_body(api: type[IdempotentApi], body: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a job of `api` (publish it, or `ctx.emit` it, with a stable
    message_id); refuses what a worker would dead-letter."""
    job = dict(body)
    parse_api_job(api, job)
    return job


class ApiKind:
    """The jobs of one API (a subclass of `providers.IdempotentApi`), as the runner reads
    them (`consumers.jobs.kind`). `name` is the API's: its log events are
    `<name>_sent`, its dead letters `invalid_<name>_job`."""

    def __init__(self, api: type[IdempotentApi]) -> None:
        name = getattr(api, "name", None)
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigurationError(
                f"{api.__name__}.name must be lower-case letters, digits and _ (it names the"
                f" channel, the log events and the dead letters), not {name!r}"
            )
        self.api = api
        self.name = name

    def bound(self, pool: asyncpg.Pool, settings: Settings) -> Self:
        return self

    def parse(self, body: Mapping[str, Any]) -> ApiJob:
        return parse_api_job(self.api, body)

    def weigh(self, body: bytes, *, max_body_bytes: int) -> int:
        return 1  # one call

    def collapse_key(self, job: ApiJob) -> str | None:
        return None  # the idempotency key is per job and target (`SendIds.effect_id`)

    async def recipients(
        self, tx: DbConnection, jobs: Sequence[tuple[str, ApiJob]]
    ) -> list[list[Recipient]]:
        return [[Recipient(channel=self.name, address=job.address)] for _, job in jobs]

    async def effect(
        self, job: ApiJob, index: int, recipient: Recipient, *, tenant: str
    ) -> ApiCall:
        return ApiCall(tenant=tenant, body=job.body)

    async def gone(self, tx: DbConnection, dead: DeadTarget) -> None:
        """Nothing of ours: the app's `on_dead_target` says what a 410 means to it."""
