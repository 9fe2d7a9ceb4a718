"""The e-mail channel's chaos: jobs over SMTP to a real SMTP server (aiosmtpd) in the run.

Each e-mail job names one or two recipients, every address its own; each is
one effect with a Message-ID derived from the job's dedupe key and the address.
The server (`providers.fakes.smtp.FakeSmtp`) records every message it read in
full; scripts, per recipient: greylisted once (451 to RCPT TO, retried), or a
dead address (550 to RCPT TO: its row fails). A tenth of the jobs are published
twice.

Counted at the server against the ledger (`proving.crash_window`), by Message-ID:
every live recipient's message arrived, no more often than once plus the kills
that had it on the wire (SMTP can be neither replayed nor asked: a message whose
final `.` was read and whose 250 never got recorded is sent again with the same
Message-ID), and the answers the workers logged as lost, counted apart. Must be
0: a message to another recipient or with another subject than its job's, rows
not settled, live recipients failed, dead addresses not failed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from consumers import email_job_body
from dedupe import DbConnection
from providers.fakes.smtp import FakeSmtp
from proving.chaos.channels.app import EMAIL_QUEUE, smtp_settings
from proving.chaos.channels.channel import ChannelFindings, effect_job, ledger_rows, settled
from proving.chaos.workload import Job, duplicates_of
from proving.crash_window import Death, Held, answers_lost, tally

GREYLISTED, DEAD = "greylisted", "dead"
_SHARES = ((GREYLISTED, 0.03), (DEAD, 0.02))


class EmailChannel:
    name = "email"
    queue = EMAIL_QUEUE

    def __init__(self) -> None:
        self.server = FakeSmtp()
        self.scripts: dict[str, str | None] = {}  # recipient -> script
        self.subjects: dict[str, str] = {}  # recipient -> its job's subject
        self.jobs = 0
        self._ids = smtp_settings(0)  # the workers' Message-ID domain

    async def __aenter__(self) -> Self:
        await self.server.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.server.__aexit__(*exc_info)

    async def prepare(self, db: DbConnection) -> None:
        return None

    def plan(self, jobs: int, rng: random.Random) -> list[Job]:
        originals = jobs - jobs // 10
        planned = []
        for n in range(originals):
            subject = f"Order {n} shipped"
            to = [f"customer-{n}-{k}@example.com" for k in range(rng.randint(1, 2))]
            for address in to:
                script = _draw(rng)
                self.scripts[address] = script
                self.subjects[address] = subject
                if script == GREYLISTED:
                    self.server.script(address, rcpt="451 4.7.1 Greylisted, try again", times=1)
                elif script == DEAD:
                    self.server.script(address, rcpt="550 5.1.1 No such user")
            body = email_job_body(to=to, subject=subject, text=f"Order {n} is on its way.")
            planned.append(effect_job(self.queue, n, f"mail-{n}", body))
        self.jobs = originals
        return planned + duplicates_of(planned, jobs - originals, rng)

    def worker_env(self, workdir: Path) -> dict[str, str]:
        return {"CHAOS_SMTP_PORT": str(self.server.port)}

    async def done(self, db: DbConnection) -> bool:
        return await settled(db, self.queue, self.jobs)

    async def count(
        self, db: DbConnection, deaths: Sequence[Death], log_dir: Path
    ) -> ChannelFindings:
        rows = await ledger_rows(db, self.queue)
        status = {str(r["address"]): r["status"] for r in rows}
        message_id = {str(r["address"]): self._ids.message_id(str(r["effect_id"])) for r in rows}
        arrivals: dict[str, list[float]] = {}
        wrong = 0
        for message in self.server.messages:
            arrivals.setdefault(message.message_id, []).append(message.received_at)
            to = message.rcpt_tos[0] if len(message.rcpt_tos) == 1 else ""
            wrong += message.message_id != message_id.get(to)
            wrong += message.message["Subject"] != self.subjects.get(to)
        live = {a for a, s in self.scripts.items() if s != DEAD}
        dead = set(self.scripts) - live
        lost = {self._ids.message_id(e): n for e, n in answers_lost(log_dir).items()}
        return ChannelFindings(
            channel=self.name,
            tally=tally(
                {message_id.get(a, a) for a in live}, arrivals, deaths, self._key, lost_answers=lost
            ),
            figures={
                "recipients": len(self.scripts),
                "messages": len(self.server.messages),
                "greylisted": sum(1 for s in self.scripts.values() if s == GREYLISTED),
                "dead": len(dead),
                "sessions": self.server.connections,
            },
            zero={
                "other_recipient_or_subject": wrong,
                "unsettled": sum(
                    1 for a in self.scripts if status.get(a) not in ("sent", "failed")
                ),
                "live_failed": sum(1 for a in live if status.get(a) == "failed"),
                "dead_not_failed": sum(1 for a in dead if status.get(a) != "failed"),
            },
        )

    def _key(self, held: Held) -> str | None:
        return self._ids.message_id(held.effect_id) if held.consumer == self.queue else None


def _draw(rng: random.Random) -> str | None:
    roll = rng.random()
    for script, share in _SHARES:
        if roll < share:
            return script
        roll -= share
    return None
