"""The demo's e-mail part: a real SMTP server (aiosmtpd) in the demo's process.

Every fifth order's handler emits an e-mail to its customer (`proving.demo.app`);
the workers send each over SMTP with a Message-ID derived from the job's dedupe
key and the address, the same on every attempt. A few customers are greylisted
once (451 to RCPT TO: retried with backoff). The count reads the ledger and the
server: delivered, arrived twice (the same Message-ID), and how many of those
the SIGKILL explains (`proving.crash_window`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from dedupe import DbConnection
from providers.fakes.smtp import FakeSmtp
from proving.crash_window import Death, Held, Tally, tally
from proving.deadlines import ANSWER_S
from proving.demo.app import EMAIL_QUEUE, customer_address, smtp_settings

GREYLIST_EVERY = 20  # of the orders that e-mail, one in this many is greylisted once


@dataclass(frozen=True, slots=True, kw_only=True)
class EmailReport:
    rows: int  # ledger rows: one per e-mail job (one recipient each)
    expected: int
    sent: int
    greylisted: int  # recipients answered 451 once
    tally: Tally
    wrong: int  # messages with another Message-ID or subject than their recipient's job

    @property
    def ok(self) -> bool:
        return self.tally.ok and self.rows == self.expected == self.sent and self.wrong == 0

    def line(self) -> str:
        return (
            f"email: rows={self.rows} sent={self.sent} greylisted={self.greylisted}"
            f" wrong={self.wrong} {self.tally.fields()}"
        )


class DemoEmail:
    def __init__(self) -> None:
        self.server = FakeSmtp()
        self.greylisted = 0
        self._ids = smtp_settings(0)  # the workers' Message-ID domain

    async def __aenter__(self) -> DemoEmail:
        await self.server.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.server.__aexit__(kind, exc, tb)

    def script(self, orders: Iterable[int]) -> None:
        for n, order in enumerate(sorted(orders)):
            if n % GREYLIST_EVERY == 0:
                self.server.script(customer_address(order), rcpt="451 4.7.1 Greylisted", times=1)
                self.greylisted += 1

    def worker_env(self) -> dict[str, str]:
        return {"DEMO_SMTP_PORT": str(self.server.port)}

    async def report(
        self,
        db: DbConnection,
        *,
        jobs: int,
        deaths: Sequence[Death],
        lost_answers: Mapping[str, int],
    ) -> EmailReport:
        rows = await db.fetch(
            "SELECT address, effect_id::text AS effect_id, status FROM send_ledger"
            " WHERE consumer = $1",
            EMAIL_QUEUE,
            timeout=ANSWER_S,
        )
        message_id = {r["address"]: self._ids.message_id(r["effect_id"]) for r in rows}
        arrivals: dict[str, list[float]] = {}
        wrong = 0
        for message in self.server.messages:
            arrivals.setdefault(message.message_id, []).append(message.received_at)
            to = message.rcpt_tos[0] if len(message.rcpt_tos) == 1 else ""
            wrong += message.message_id != message_id.get(to)
            order = to.removeprefix("customer-").partition("@")[0]
            wrong += message.message["Subject"] != f"Order {order} shipped"
        return EmailReport(
            rows=len(rows),
            expected=jobs,
            sent=sum(1 for r in rows if r["status"] == "sent"),
            greylisted=self.greylisted,
            tally=tally(
                set(message_id.values()),
                arrivals,
                deaths,
                self._key,
                lost_answers={self._ids.message_id(e): n for e, n in lost_answers.items()},
            ),
            wrong=wrong,
        )

    def _key(self, held: Held) -> str | None:
        return self._ids.message_id(held.effect_id) if held.consumer == EMAIL_QUEUE else None
