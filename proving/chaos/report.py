"""The chaos run's output: one summary line, then a table by fault kind."""

from __future__ import annotations

from dataclasses import dataclass

from proving.chaos.checker import Findings
from proving.chaos.faults import RESTARTS, FaultKind, FaultLog
from proving.chaos.fleet import FleetCounts
from proving.chaos.pushes import PushFindings

_KILLS = (
    FaultKind.SIGKILL,
    FaultKind.CRASH_BEFORE_COMMIT,
    FaultKind.CRASH_AFTER_COMMIT,
    FaultKind.CRASH_AFTER_SEND,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PushFigures:
    """Phase 2 (push jobs); zero until the push workload runs."""

    pushes: int = 0
    extra_pushes: int = 0
    crashes_in_send: int = 0


_RELAY_KILLS = (FaultKind.RELAY_KILL, FaultKind.CRASH_AFTER_PUBLISH)


def summary_line(findings: Findings, faults: FaultLog, push: PushFigures) -> str:
    kills = sum(faults.injected[k] for k in _KILLS)
    restarts = sum(faults.injected[k] for k in RESTARTS)
    lost = findings.lost + findings.followups_lost
    doubled = findings.doubled + findings.followups_doubled
    return (
        f"chaos: messages={findings.messages} faults={sum(faults.injected.values())}"
        f" kills={kills} relay_kills={sum(faults.injected[k] for k in _RELAY_KILLS)}"
        f" restarts={restarts} lost={lost}"
        f" doubled={doubled} stuck={findings.stuck} followups={findings.followups}"
        f" pushes={push.pushes}"
        f" extra_pushes={push.extra_pushes} crashes_in_send={push.crashes_in_send}"
        f" dead_lettered={findings.dead_lettered} max_attempts={findings.max_attempts}"
        f" handler_timeouts={findings.handler_timeouts} hangs={findings.hangs}"
        f" decode_poison={findings.decode_poison_dead_lettered}"
        f" innocent_dead_lettered={findings.innocent_dead_lettered}"
    )


def fault_table(faults: FaultLog) -> list[str]:
    lines = [f"{'fault':<22}{'injected':>10}{'hit':>8}{'down s':>9}"]
    for kind in FaultKind:
        down = faults.downtime.get(kind, 0.0)
        lines.append(
            f"{kind:<22}{faults.injected[kind]:>10}{faults.affected[kind]:>8}"
            f"{(f'{down:.1f}' if down else '-'):>9}"
        )
    lines.append("hit: workers killed or stopped, connections reset or held; down: restart time")
    return lines


def details(findings: Findings, fleet: FleetCounts, published: int, republished: int) -> list[str]:
    rows = [
        ("publishes confirmed", published),
        ("publishes retried (same message_id)", republished),
        ("distinct local jobs", findings.unique_local),
        ("effect rows", findings.effects),
        ("unexpected effect keys", findings.unexpected),
        ("follow-ups applied (emitted, relayed)", findings.followups),
        ("effects whose follow-up is lost", findings.followups_lost),
        ("follow-ups doubled", findings.followups_doubled),
        ("follow-ups of no effect", findings.followups_unexpected),
        ("local jobs dead-lettered", findings.local_dead_lettered),
        ("poison dead-lettered", f"{findings.poison_dead_lettered}/{findings.poison}"),
        (
            f"poison slowest s (limit {findings.poison_limit_s:.0f})",
            f"{findings.poison_slowest_s:.1f}",
        ),
        ("poison dead-lettered later than limit", findings.poison_late),
        ("malformed dead-lettered", f"{findings.malformed_dead_lettered}/{findings.malformed}"),
        (
            "decode poison dead-lettered (its reason)",
            f"{findings.decode_poison_dead_lettered}/{findings.decode_poison}",
        ),
        (
            "handler timeouts seen (planned jobs)",
            f"{findings.handler_timeouts}/{findings.timeout_jobs}",
        ),
        ("timed-out jobs effected once", f"{findings.timeouts_effected}/{findings.timeout_jobs}"),
        ("other jobs timed out (under faults)", findings.other_timeouts),
        ("hangs ended by the watchdog (exit 70)", f"{findings.hangs}/{findings.hang_jobs}"),
        ("hang jobs effected once", f"{findings.hangs_effected}/{findings.hang_jobs}"),
        ("watchdog exits with no planned hang", findings.unexpected_stuck),
        ("dead-letter copies (seen twice)", findings.dead_letter_copies),
        ("worker starts", fleet.starts),
        ("worker start failures (service down)", fleet.start_failures),
        ("SIGTERMs not exiting 0", fleet.unclean_terms),
        ("SIGTERMs while starting (exit -15)", fleet.terms_while_starting),
    ]
    rows += [(f"dead-lettered: {reason}", n) for reason, n in sorted(findings.reasons.items())]
    lines = [f"{name:<40}{value!s:>12}" for name, value in rows]
    if findings.lost_sample:
        lines.append(f"lost (sample): {', '.join(findings.lost_sample)}")
    if findings.innocent_sample:
        lines.append(f"valid jobs dead-lettered (sample): {', '.join(findings.innocent_sample)}")
    if findings.doubled_sample:
        lines.append(f"doubled (sample): {', '.join(findings.doubled_sample)}")
    return lines


def push_details(push: PushFindings) -> list[str]:
    rows = [
        ("push devices (job targets)", push.devices),
        ("pushes taken by the fakes", push.pushes),
        ("extra pushes", push.extra_pushes),
        ("sends cut by a crash (crashes_in_send)", push.crashes_in_send),
        ("answers lost to scripted timeout/drop", push.lost_answers),
        ("extras with another collapse id", push.collapse_mismatches),
        ("live devices never pushed (lost)", push.lost),
        ("dead tokens not marked failed", push.dead_not_failed),
        ("ledger rows not settled", push.unsettled),
    ]
    return [f"{name:<40}{value!s:>12}" for name, value in rows]
