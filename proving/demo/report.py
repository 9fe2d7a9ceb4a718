"""What the demo prints at the end, and whether it passed.

A table of the local effects and the sends, a table per channel of what its
receiver took (delivered, arrived twice, on the wire at the SIGKILL), then one
line per part, each of which a reader (or a test) can grep:

    demo:      the local effects and the pushes
    outbox:    the follow-ups the order handler emitted
    ingress:   the push jobs sent over HTTP through `serve`
    push.apns, push.fcm, push.webpush, webhooks, email:  each channel at its receiver
    webpush:   the Web Push requests the fake verified (VAPID) and decrypted
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from proving.crash_window import Tally
from proving.demo.emails import EmailReport
from proving.demo.ingress import IngressReport
from proving.demo.local import Job, OutboxReport
from proving.demo.pushes import PushReport
from proving.demo.webhooks import WebhookReport


@dataclass(frozen=True, slots=True, kw_only=True)
class Counted:
    planned: Sequence[Job]
    unique: set[tuple[str, str | None]]
    effects: int
    doubled: int
    lost: int
    dead: Counter[tuple[str, str]]  # (reason, message_id) -> copies
    kills: int
    # Sends the workers logged with an unknown outcome (a timeout): no fault is injected
    # but the kill, so each is a defect to look at; what one costs (a second arrival
    # beyond the kill's window) fails the demo at its receiver's count.
    unknown: int
    elapsed: float
    push: PushReport
    outbox: OutboxReport
    ingress: IngressReport
    webhooks: WebhookReport
    email: EmailReport

    @property
    def channels(self) -> dict[str, Tally]:
        return {**self.push.tallies, "webhooks": self.webhooks.tally, "email": self.email.tally}

    @property
    def ok(self) -> bool:
        local = self.lost == 0 and self.doubled == 0 and self.effects == len(self.unique)
        sends = self.push.ok and self.webhooks.ok and self.email.ok
        sends = sends and self.outbox.ok and self.ingress.ok
        return local and sends


def print_report(c: Counted) -> bool:
    """Print the tables and lines; True when the demo passed."""
    reused = {mid for (reason, mid) in c.dead if reason == "message_id_reused"}
    well_formed = sum(1 for j in c.planned if j.kind != "malformed")
    duplicates_ignored = (
        well_formed
        - c.effects
        - sum(n for (reason, _), n in c.dead.items() if reason == "message_id_reused")
    )
    push, hooks = c.push, c.webhooks
    rows: list[tuple[str, object]] = [
        ("published", len(c.planned)),
        ("distinct orders (unique)", len(c.unique)),
        ("effects in demo_effects", c.effects),
        ("duplicates ignored", duplicates_ignored),
    ]
    rows += [
        (f"dead-lettered: {reason}", n)
        for reason, n in sorted(Counter(r for r, _ in set(c.dead)).items())
    ]
    rows += [
        ("push targets", push.expected),
        ("pushes sent (ledger)", push.sent),
        ("pushes failed: dead target", push.failed),
        ("targets pruned by the hook", push.pruned),
        ("provider ids recorded", push.provider_ids_recorded),
        ("web pushes verified (VAPID, decrypted)", push.verified),
        ("web pushes refused by the push service", push.refused),
        ("extra pushes at the fakes", push.extra_pushes),
        ("  beyond their rows leases", push.extra_beyond_leases),
        ("  of them with another collapse id", push.extra_with_other_collapse_id),
        ("webhook endpoints (3 tenants)", hooks.endpoints),
        ("webhooks to send (ledger)", hooks.rows),
        ("webhooks sent (ledger)", hooks.sent),
        ("webhooks verified (standardwebhooks)", hooks.verified),
        ("webhooks rejected by the receiver", hooks.rejected),
        ("  bodies cut short by the SIGKILL", hooks.cut),
        ("webhook secrets in the workers logs", hooks.secrets_in_logs),
        ("e-mails to send (ledger)", c.email.rows),
        ("e-mails sent (ledger)", c.email.sent),
        ("  recipients greylisted once (451)", c.email.greylisted),
        ("sends with an unknown outcome", c.unknown),
        ("follow-ups emitted to the outbox", c.outbox.enqueued),
        ("  published by the relays", c.outbox.published),
        ("  pushed (ledger settled)", c.outbox.emitted),
        ("workers SIGKILLed", c.kills),
        ("lost", c.lost),
        ("doubled", c.doubled),
        ("elapsed s", f"{c.elapsed:.1f}"),
    ]
    print()
    for name, value in rows:
        print(f"{name:<40}{value!s:>10}")
    print()
    print(
        f"{'at the receiver':<16}{'intents':>9}{'delivered':>11}{'twice':>7}"
        f"{'on the wire at the kill':>25}{'timed out':>11}{'beyond':>8}{'lost':>6}"
    )
    for name, t in c.channels.items():
        print(
            f"{name:<16}{t.intents:>9}{t.delivered:>11}{t.arrived_twice:>7}"
            f"{t.on_the_wire:>25}{t.lost_answers:>11}{t.beyond_window:>8}{t.lost:>6}"
        )
    print("twice: the same token, endpoint (Topic), webhook-id or Message-ID taken again")
    print("timed out: calls whose answer a worker gave up on, sent again with the same id")
    print("beyond: taken twice, neither on the wire at the kill nor timed out (must be 0)")
    print()
    print(
        f"demo: published={len(c.planned)} unique={len(c.unique)} effects={c.effects} "
        f"duplicates_ignored={duplicates_ignored} reused={len(reused)} "
        f"dead_lettered={len(set(c.dead))} lost={c.lost} doubled={c.doubled} "
        f"pushes={push.sent} provider_ids_recorded={push.provider_ids_recorded} "
        f"extra_pushes={push.extra_pushes} extra_beyond_leases={push.extra_beyond_leases} "
        f"unknown_outcomes={c.unknown} "
        f"extra_with_other_collapse_id={push.extra_with_other_collapse_id}"
    )
    print(c.outbox.line())
    print(c.ingress.line())
    for line in push.lines():
        print(line)
    print(hooks.line())
    print(c.email.line())
    for name, t in c.channels.items():
        if t.sample:
            print(
                f"{name}: lost or doubled beyond the crash window (sample): {', '.join(t.sample)}"
            )
    return c.ok
