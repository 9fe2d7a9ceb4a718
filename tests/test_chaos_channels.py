"""A chaos profile per channel, in its CI form, run exactly as `idempotent-workers chaos
--profile <name>-ci` runs it: workers SIGKILLed mid-call on a schedule (and armed to
die between a provider's answer and its record), counted at the receiver.

    webhooks    every delivery verified by `standardwebhooks`; each intent under one
                webhook-id, arrived, and twice only when a kill had it on the wire
    webpush     every request's VAPID JWT verified and payload decrypted by the push
                service; twice only when a kill had it on the wire, the same Topic
    email       every message by Message-ID at aiosmtpd; twice only on the wire
    api, api-lookup  a Stripe-like payments API: each key charged exactly once

Each runs against a private RabbitMQ node and PostgreSQL cluster of its own, as a
child process, so its fleet and services live and die with it.
"""

from __future__ import annotations

import re
import sys

import pytest

from proving.chaos.channels.channel import ChannelFindings
from proving.chaos.channels.profile import CHANNEL_PROFILES
from proving.crash_window import Tally
from tests.support import run_to_end

# What must be 0 in each channel's line, beside lost and beyond_window.
ZERO = {
    "webhooks": (
        "rejected",
        "unsettled",
        "live_failed",
        "gone_sent",
        "rows_missing",
        "intents_under_two_ids",
    ),
    "webpush": ("refused", "other_text", "other_topic", "unsettled", "live_failed"),
    "email": ("other_recipient_or_subject", "unsettled", "live_failed", "dead_not_failed"),
    "api": ("keys_charged_twice", "charges_without_row", "unsettled", "failed", "duplicates"),
    "api-lookup": (
        "keys_charged_twice",
        "charges_without_row",
        "unsettled",
        "failed",
        "duplicates",
    ),
}


def _line(stdout: str, channel: str) -> dict[str, int]:
    found = re.findall(rf"^chaos\.{re.escape(channel)}: .*$", stdout, re.MULTILINE)
    assert found, f"no chaos.{channel} line\n{stdout[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", found[-1])}


@pytest.mark.slow
@pytest.mark.timeout(660)
@pytest.mark.parametrize("channel", ["webhooks", "webpush", "email", "api", "api-lookup"])
def test_channel_profile_delivers_every_intent_and_twice_only_what_a_kill_had_on_the_wire(
    channel: str,
) -> None:
    profile = CHANNEL_PROFILES[f"{channel}-ci"]
    run = run_to_end(
        [sys.executable, "-m", "consumers", "chaos", "--profile", profile.name], timeout=600
    )
    figures = _line(run.stdout, channel)
    assert figures["lost"] == 0 and figures["beyond_window"] == 0, run.stdout[-3000:]
    assert figures["delivered"] == figures["intents"] > 0, run.stdout[-3000:]
    assert {name: figures[name] for name in ZERO[channel]} == dict.fromkeys(ZERO[channel], 0)
    assert figures["stuck"] == 0, run.stdout[-3000:]
    # The schedule's SIGKILLs happened, and some starts died after a send.
    assert figures["kills"] >= profile.sigkills, run.stdout[-3000:]
    if channel == "webhooks":  # every delivery verified, but those cut short by a death
        assert figures["verified"] + figures["cut_by_kills"] == figures["deliveries"]
    if channel == "webpush":
        assert figures["verified"] >= figures["intents"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    print(re.findall(rf"^chaos\.{re.escape(channel)}: .*$", run.stdout, re.MULTILINE)[-1])


def _findings(duplicates: int, *, exactly_once: bool, zero: int = 0) -> ChannelFindings:
    tally = Tally(
        intents=10,
        delivered=10,
        arrivals=10 + duplicates,
        arrived_twice=duplicates,
        duplicates=duplicates,
        on_the_wire=duplicates,
        lost_answers=0,
        beyond_window=0,
    )
    return ChannelFindings(
        channel="c", tally=tally, figures={}, zero={"x": zero}, exactly_once=exactly_once
    )


def test_a_channel_that_replays_or_is_asked_fails_on_any_duplicate_even_on_the_wire() -> None:
    assert _findings(2, exactly_once=False).ok
    assert not _findings(2, exactly_once=True).ok
    assert _findings(0, exactly_once=True).ok
    assert not _findings(0, exactly_once=False, zero=1).ok


def test_every_channel_has_a_ci_form_and_a_full_one() -> None:
    names = set(CHANNEL_PROFILES)
    for channel in ZERO:
        assert {channel, f"{channel}-ci"} <= names
        ci, full = CHANNEL_PROFILES[f"{channel}-ci"], CHANNEL_PROFILES[channel]
        assert ci.jobs < full.jobs and ci.kills < full.kills and ci.load_seconds <= 60
