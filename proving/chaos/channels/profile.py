"""How much load and how many kills a channel profile puts through its channel.

    --profile webhooks      --profile webhooks-ci
    --profile webpush       --profile webpush-ci
    --profile email         --profile email-ci
    --profile api           --profile api-ci          (replayed by key after a crash)
    --profile api-lookup    --profile api-lookup-ci   (asked by key first)

A CI form is what the suite runs (tests/test_chaos_channels.py): a few minutes
at most on a 2-core machine. Kills are SIGKILLs of a random worker at random
times over the load phase, and starts armed to SIGKILL themselves after a
provider answered and before the answer is recorded (`crash_after_send`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelProfile:
    name: str
    channel: str  # proving.chaos.channels.app.APPS' key (the worker app's name)
    jobs: int  # publishes, a tenth of them duplicates
    workers: int
    load_seconds: float  # publishing and kills are spread over this
    sigkills: int
    crashes_after_send: int  # a quota of armed starts, spread over the load
    max_crash_after: int = 20  # an armed start dies at its 0th..this-th record
    latency_s: float = 0.05  # how long the fake takes to answer: calls are on the wire
    drain_seconds: float = 180.0

    @property
    def kills(self) -> int:
        return self.sigkills + self.crashes_after_send


def _pair(
    name: str, channel: str, *, ci_jobs: int, full_jobs: int
) -> tuple[ChannelProfile, ChannelProfile]:
    ci = ChannelProfile(
        name=f"{name}-ci",
        channel=channel,
        jobs=ci_jobs,
        workers=3,
        load_seconds=60.0,
        sigkills=8,
        crashes_after_send=4,
    )
    full = ChannelProfile(
        name=name,
        channel=channel,
        jobs=full_jobs,
        workers=3,
        load_seconds=300.0,
        sigkills=40,
        crashes_after_send=20,
        max_crash_after=60,
        drain_seconds=300.0,
    )
    return ci, full


CHANNEL_PROFILES = {
    p.name: p
    for p in (
        *_pair("webhooks", "webhooks", ci_jobs=1_500, full_jobs=20_000),
        *_pair("webpush", "webpush", ci_jobs=1_500, full_jobs=20_000),
        *_pair("email", "email", ci_jobs=1_000, full_jobs=10_000),
        *_pair("api", "api", ci_jobs=1_500, full_jobs=20_000),
        *_pair("api-lookup", "api_lookup", ci_jobs=1_500, full_jobs=20_000),
    )
}
