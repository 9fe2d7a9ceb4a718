"""The seam between the send ledger's runner and a kind of external effect.

The runner (`consumers.effects`) is one for every kind: it claims a job, writes
its targets' intents with stable ids, sends each through the queue's provider
under a lease, records each answer, and settles the job. What differs by kind
is said here, by the kind, in the order the runner asks:

1. `parse(body)`: the job, or `InvalidJob` with the field that is wrong; the
   delivery is dead-lettered as `invalid_<name>_job`, and the send API refuses
   the same body with the same words;
2. `weigh(body)`: the targets a delivered job names, read before its batch
   decodes it, so a queue's batches hold a bounded number of targets;
3. `recipients(tx, jobs)`: whom each new job (with its tenant) goes to, asked once, in the
   claim's transaction, and written to the ledger: a push job names its devices,
   an e-mail its addresses, a webhook job is sent to the tenant's endpoints that
   take its event type. A redelivered job goes to the rows written then;
4. `effect(job, index, recipient, tenant=...)`: what one target is sent (the
   provider's input), built when its send can start, with no transaction open: a
   webhook call reads its endpoint's address and current signing secrets then; an
   API call carries the tenant whose job it is. An error here sends
   nothing: a `ProviderError` counts as the provider's answer, anything else as a
   transient failure;
5. `gone(tx, dead)`: what a target the provider called dead means, in the
   transaction that records it (a webhook endpoint that answered 410 is disabled).

`bound(pool, settings)` is called once per queue when a worker starts: the kind
the runner uses, given the worker's database pool and settings (a webhook kind
reads its endpoints through them; push needs neither and returns itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

import asyncpg

from consumers.settings import Settings
from dedupe import DbConnection

J = TypeVar("J")


class InvalidJob(ValueError):
    """The body is not a job of its kind; the message says which field is wrong."""


def invalid_job_reason(name: str) -> str:
    """The reason a job of the kind `name` that does not parse is dead-lettered with."""
    return f"invalid_{name}_job"


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipient:
    """Whom one effect goes to, as its ledger row says.

    `channel`: ios, android, web, webhook, email, or an API channel's name;
    `address`: the device token, the subscription endpoint, the webhook endpoint's
    id, the e-mail address, the resource an API call acts on."""

    channel: str
    address: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadTarget:
    """A target the provider called dead: an unregistered device token, a bad e-mail
    address, a webhook endpoint that answered 410 Gone."""

    tenant: str
    message_id: str
    channel: str
    address: str
    reason: str


class EffectKind(Protocol[J]):
    """One kind of external effect (see the module docstring for the order of the calls).

    `name`: push, webhook, email, or an API channel's kind; it names the dead-letter
    reason (`invalid_<name>_job`), the log events (`<name>_sent`) and the metrics' label.
    """

    name: str

    def bound(self, pool: asyncpg.Pool, settings: Settings) -> Self: ...

    def parse(self, body: Mapping[str, Any]) -> J: ...

    def weigh(self, body: bytes, *, max_body_bytes: int) -> int: ...

    def collapse_key(self, job: J) -> str | None: ...

    async def recipients(
        self, tx: DbConnection, jobs: Sequence[tuple[str, J]]
    ) -> list[list[Recipient]]: ...

    async def effect(self, job: J, index: int, recipient: Recipient, *, tenant: str) -> object: ...

    async def gone(self, tx: DbConnection, dead: DeadTarget) -> None: ...


# The channels whose addresses are device credentials: shown by their first characters.
DEVICE_CHANNELS = frozenset({"ios", "android", "web", "webpush"})


def shown_address(channel: str, address: str) -> str:
    """An address as a log line, `inspect` or the console shows it: a device token or a
    subscription endpoint cut to its first characters, an e-mail address to the first
    letter of its mailbox and its domain, any other address (a webhook endpoint's id,
    an API resource) whole."""
    if channel in DEVICE_CHANNELS:
        return f"{address[:6]}…" if len(address) > 8 else "…"
    if channel == "email":
        mailbox, at, domain = address.rpartition("@")
        return f"{mailbox[:1]}…@{domain}" if at else "…"
    return address
