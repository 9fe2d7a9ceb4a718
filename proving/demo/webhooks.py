"""The demo's webhook part: endpoints per tenant, a receiver that verifies every delivery.

Each tenant gets two endpoints, registered through the real endpoint store
(`dedupe.WebhookEndpoints.add`, as `idempotent-workers webhook endpoint add` does)
with their secrets encrypted under a key made for the run; the workers get that
key as IW_WEBHOOK_SECRETS_KEY. Both endpoints are paths of one `WebhookReceiver`
(real HTTP, in the demo's process), which verifies every delivery with the
`standardwebhooks` package against the secret the store handed back (a body cut
short by the SIGKILL cannot verify: counted apart), and answers
after a few milliseconds, so calls are on the wire when a worker is SIGKILLed.

The count reads the ledger (one row per order and endpoint) and the receiver:
delivered, arrived twice (the same webhook-id), and how many of those the
SIGKILL explains (`proving.crash_window`). A secret found in a worker's log
fails the demo too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cryptography.fernet import Fernet

from consumers.jobs.webhook_endpoints import secret_box
from dedupe import DbConnection, WebhookEndpoints
from providers.fakes.webhooks import ReceiverReply, WebhookReceiver
from proving.crash_window import Death, Held, Tally, tally, webhook_id_of, webhook_key
from proving.deadlines import ANSWER_S
from proving.demo.app import WEBHOOK_EVENT, WEBHOOK_QUEUE

LATENCY_S = 0.05  # calls are on the wire at the SIGKILL
# Per tenant: (path under /<tenant>, event types the endpoint takes; none: every one).
ENDPOINTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("orders", (WEBHOOK_EVENT,)),
    ("audit", ()),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookReport:
    endpoints: int
    rows: int  # ledger rows: one per emitted job and endpoint of its tenant
    expected: int  # what the plan's orders should have made
    sent: int
    tally: Tally
    verified: int  # deliveries standardwebhooks verified
    rejected: int  # whole deliveries no trusted secret verified
    cut: int  # deliveries whose body was cut short: their sender died writing them
    secrets_in_logs: int

    @property
    def ok(self) -> bool:
        return (
            self.tally.ok
            and self.rows == self.expected == self.sent
            and self.rejected == 0
            and self.secrets_in_logs == 0
        )

    def line(self) -> str:
        return (
            f"webhooks: endpoints={self.endpoints} rows={self.rows} sent={self.sent}"
            f" verified={self.verified} rejected={self.rejected} cut_by_kill={self.cut}"
            f" {self.tally.fields()}"
        )


def _logs(log_dir: Path) -> str:
    """Every worker's and serve's log, to look for a secret in."""
    return "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("*.log")))


def _webhook_key(held: Held) -> str | None:
    return webhook_key(held) if held.consumer == WEBHOOK_QUEUE else None


class DemoWebhooks:
    """The receiver, the run's key, and the endpoints once `register` made them."""

    def __init__(self) -> None:
        self.receiver = WebhookReceiver()
        self.key = Fernet.generate_key().decode()
        self.secrets: list[str] = []

    async def __aenter__(self) -> DemoWebhooks:
        await self.receiver.__aenter__()
        self.receiver.unscripted = ReceiverReply(latency=LATENCY_S)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.receiver.__aexit__(kind, exc, tb)

    async def register(self, db: DbConnection, tenants: Sequence[str]) -> None:
        """Each tenant's endpoints, made by the store; the receiver trusts their secrets."""
        store, box = WebhookEndpoints("public"), secret_box((self.key,))
        for tenant in tenants:
            for name, event_types in ENDPOINTS:
                path = f"/{tenant}/{name}"
                _, secret = await store.add(
                    db, tenant=tenant, url=self.receiver.url(path), event_types=event_types, box=box
                )
                self.receiver.trust(path, secret)
                self.secrets.append(secret)

    def worker_env(self) -> dict[str, str]:
        return {"IW_WEBHOOK_SECRETS_KEY": self.key}

    async def report(
        self,
        db: DbConnection,
        *,
        jobs: int,
        deaths: Sequence[Death],
        log_dir: Path,
        lost_answers: Mapping[str, int],
    ) -> WebhookReport:
        rows = await db.fetch(
            "SELECT effect_id::text AS effect_id, status FROM send_ledger WHERE consumer = $1",
            WEBHOOK_QUEUE,
            timeout=ANSWER_S,
        )
        arrivals: dict[str, list[float]] = {}
        for delivery in self.receiver.deliveries:
            if delivery.verified:  # a rejected one was answered 401: not taken
                arrivals.setdefault(delivery.webhook_id, []).append(delivery.received_at)
        intents = {webhook_id_of(r["effect_id"]) for r in rows}
        logs = _logs(log_dir)
        rejected = self.receiver.rejected
        cut = [d for d in rejected if len(d.body) < int(d.headers.get("content-length", "0"))]
        return WebhookReport(
            endpoints=len(self.secrets),
            rows=len(rows),
            expected=jobs * len(ENDPOINTS),
            sent=sum(1 for r in rows if r["status"] == "sent"),
            tally=tally(
                intents,
                arrivals,
                deaths,
                _webhook_key,
                lost_answers={webhook_id_of(e): n for e, n in lost_answers.items()},
            ),
            verified=sum(1 for d in self.receiver.deliveries if d.verified),
            rejected=len(rejected) - len(cut),
            cut=len(cut),
            secrets_in_logs=sum(1 for s in self.secrets if s.removeprefix("whsec_") in logs),
        )
