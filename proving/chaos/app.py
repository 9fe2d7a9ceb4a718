"""The worker apps the chaos run starts: local effects, poison, and pushes.

    chaos.local    one row in `chaos_effects` per job, staged (executemany); a
                   quarter of them (`follows_up`) also emit a follow-up to
                   chaos.followup with it (`ctx.emit`), which the run's relay
                   processes publish from the outbox
    chaos.followup one row in `chaos_followups` per follow-up
    chaos.slow     local jobs too (the same row, the same follow-up), on a
                   deadline of SLOW_TIMEOUT_S; the body's `act` makes some of
                   them misbehave once: `timeout` awaits past the deadline on
                   attempt 1 (cancelled, rolled back, retried), `hang` blocks
                   the event loop the first time it runs (the watchdog ends the
                   process with exit 70, the broker redelivers); the rest are
                   their batchmates, which must commit all the same
    chaos.poison   always raises: retried on short tiers, dead-lettered after
                   POISON_MAX_ATTEMPTS attempts
    chaos.push     (`push_app` only) push jobs through the send ledger to the
                   run's fake APNs and FCM servers; where those listen comes in
                   CHAOS_* variables, read when the worker builds its provider

`chaos_effects` and `chaos_followups` have no unique constraint on purpose: a doubled effect shows
up as a second row for the same key instead of being hidden by an error.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from enum import StrEnum
from pathlib import Path

from consumers import App, Context, RetryPolicy
from providers import Provider
from proving.faults import SigkillAt

LOCAL_QUEUE = "chaos.local"
POISON_QUEUE = "chaos.poison"
PUSH_QUEUE = "chaos.push"
FOLLOWUP_QUEUE = "chaos.followup"
SLOW_QUEUE = "chaos.slow"
SLOW_TIMEOUT_S = 1.0  # chaos.slow's handler deadline
# A hang blocks this long: far past the watchdog's limit (the fleet sets the
# workers' default deadline and grace), so only the watchdog ends it.
HANG_SECONDS = 120.0
# Where hang jobs leave their marker: one file per message_id holding the pid
# that hung on it. A job hangs only the first time; the fleet reads the
# markers to tell an expected watchdog exit (70) from one nobody planned.
HANG_DIR_ENV = "CHAOS_HANG_DIR"
PROVIDER_TIMEOUT_S = 2.0
# Sends start only while the lease, renewed as they go, leaves their answer time
# (consumers.effects.lease): 70% of 15 s covers the 2 s timeout with room under load.
PUSH_LEASE_S = 15.0
POISON_MAX_ATTEMPTS = 5

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    id          bigserial PRIMARY KEY,
    tenant      text NOT NULL,
    message_id  text NOT NULL,
    worker_pid  integer NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS chaos_followups (
    id          bigserial PRIMARY KEY,
    tenant      text NOT NULL,
    message_id  text NOT NULL,  -- the local job's, whose effect emitted it
    worker_pid  integer NOT NULL
)"""
FOLLOWUP_SUFFIX = ":next"

# The default five attempts, on tiers short enough for a run; the poison queue's tiers are short
# too: how late its jobs may be dead-lettered follows from them (proving.chaos.latency).
LOCAL_RETRY = RetryPolicy(base_seconds=0.5, tiers_seconds=(0.5, 2.0, 8.0))
POISON_RETRY = RetryPolicy(
    max_attempts=POISON_MAX_ATTEMPTS, base_seconds=0.5, tiers_seconds=(0.5, 1.0, 2.0, 4.0)
)


class Act(StrEnum):
    """What a chaos.slow job does before its effect (the body's `act`)."""

    NONE = ""
    TIMEOUT = "timeout"  # awaits past the deadline on attempt 1
    HANG = "hang"  # blocks the event loop the first time it runs


class PoisonError(Exception):
    """What the poison handler raises, every time."""


async def apply_local(ctx: Context) -> None:
    await ctx.stage(
        "INSERT INTO chaos_effects (tenant, message_id, worker_pid) VALUES ($1, $2, $3)",
        ctx.tenant,
        ctx.message_id,
        os.getpid(),
    )
    if follows_up(ctx.message_id):
        await ctx.emit(
            FOLLOWUP_QUEUE, {"of": ctx.message_id}, message_id=ctx.message_id + FOLLOWUP_SUFFIX
        )


def follows_up(message_id: str) -> bool:
    """A stable quarter of the local jobs: enough rows for the relays, not twice the work."""
    return zlib.crc32(message_id.encode()) % 4 == 0


async def apply_slow(ctx: Context) -> None:
    """A local job that may first misbehave as its `act` says, then does its effect."""
    act = Act(ctx.body.get("act", ""))
    if act is Act.TIMEOUT and ctx.attempt == 1:
        await asyncio.sleep(SLOW_TIMEOUT_S * 10)  # cancelled at the deadline
    elif act is Act.HANG and first_hang(ctx.message_id):
        time.sleep(HANG_SECONDS)  # noqa: ASYNC251 -- the point: the watchdog must end it
    await apply_local(ctx)


def first_hang(message_id: str) -> bool:
    """True once per hang job: its marker, created here, names the process that hangs."""
    directory = os.environ.get(HANG_DIR_ENV)
    if not directory:
        return False  # no fleet watching for exit 70: never hang
    try:
        with (Path(directory) / message_id).open("x") as marker:
            marker.write(str(os.getpid()))
    except FileExistsError:
        return False
    return True


def hang_markers(directory: Path) -> dict[str, int]:
    """message_id -> pid of the process that hung on it, from the markers."""
    found = {}
    for path in directory.iterdir():
        text = path.read_text().strip()
        if text.isdigit():
            found[path.name] = int(text)
    return found


async def apply_followup(ctx: Context) -> None:
    await ctx.stage(
        "INSERT INTO chaos_followups (tenant, message_id, worker_pid) VALUES ($1, $2, $3)",
        ctx.tenant,
        ctx.body["of"],
        os.getpid(),
    )


async def always_fail(ctx: Context) -> None:
    raise PoisonError(f"poison job {ctx.message_id} never succeeds")


async def fake_providers() -> Provider:
    """APNs and FCM providers pointed at the chaos run's fakes."""
    from providers.fakes.env import router_from_env

    return router_from_env(os.environ, "CHAOS_", timeout_seconds=PROVIDER_TIMEOUT_S)


def _build(*, push: bool) -> App:
    built = App(faults=SigkillAt.from_env(os.environ))  # armed by the chaos fleet
    built.handler(LOCAL_QUEUE, retry=LOCAL_RETRY)(apply_local)
    built.handler(POISON_QUEUE, retry=POISON_RETRY)(always_fail)
    built.handler(FOLLOWUP_QUEUE, retry=LOCAL_RETRY)(apply_followup)
    built.handler(SLOW_QUEUE, retry=LOCAL_RETRY, timeout=SLOW_TIMEOUT_S)(apply_slow)
    if push:
        built.push_handler(
            PUSH_QUEUE, provider=fake_providers, lease_seconds=PUSH_LEASE_S, retry=LOCAL_RETRY
        )
    return built


app = _build(push=False)  # local effects and poison only
push_app = _build(push=True)  # and push jobs to the fake providers
