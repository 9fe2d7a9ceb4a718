"""The e-mail app the process tests run, pointed at a fake SMTP server the test serves.

The test passes where the fake listens (`TEST_SMTP_PORT`) in the environment;
`suppressed` records what `on_dead_address` saw.
"""

from __future__ import annotations

import os

from consumers import App, DeadTarget, RetryPolicy, UnknownOutcome
from dedupe import DbConnection
from providers import SmtpSettings, SmtpTls
from proving.faults import SigkillAt

FAST_RETRY = RetryPolicy(max_attempts=5, base_seconds=0.2, tiers_seconds=(0.2, 0.5, 1.0, 2.0))
SUPPRESSED_TABLE = "CREATE TABLE suppressed (address text NOT NULL, reason text NOT NULL)"

app = App(retry=FAST_RETRY, faults=SigkillAt.from_env(os.environ))


def smtp_settings(port: int, *, timeout: float = 5.0) -> SmtpSettings:
    return SmtpSettings(
        host="127.0.0.1",
        port=port,
        tls=SmtpTls.NONE,  # the fake on this machine: plain text is allowed to loopback only
        default_from="Shop <shop@example.com>",
        timeout_seconds=timeout,
        connect_timeout_seconds=min(timeout, 2.0),
    )


async def suppress(tx: DbConnection, dead: DeadTarget) -> None:
    await tx.execute(
        "INSERT INTO suppressed (address, reason) VALUES ($1, $2)", dead.address, dead.reason
    )


if "TEST_SMTP_PORT" in os.environ:
    app.email_handler(
        os.environ.get("TEST_QUEUE", "emails"),
        settings=smtp_settings(
            int(os.environ["TEST_SMTP_PORT"]),
            timeout=float(os.environ.get("TEST_SMTP_TIMEOUT", "5")),
        ),
        on_dead_address=suppress,
        unknown_outcome=UnknownOutcome(os.environ.get("TEST_UNKNOWN_OUTCOME", "resend")),
        lease_seconds=float(os.environ.get("TEST_LEASE_SECONDS", "10")),
    )
