"""`idempotent-workers demo`, small: every channel delivered at its receiver, twice only
what the SIGKILLed worker had on the wire, every webhook verified by standardwebhooks,
every web push's VAPID JWT verified and payload decrypted; exit 0.

It drops and makes the database `idempotent_workers_demo` of the configured server, as
`make demo` does; a run of its own, as a child process.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import AMQP_URL, DATABASE_URL
from tests.support import run_to_end

CHANNELS = ("push.apns", "push.fcm", "push.webpush", "webhooks", "email")


def _fields(stdout: str, name: str) -> dict[str, int]:
    found = re.findall(rf"^{re.escape(name)}: .*$", stdout, re.MULTILINE)
    assert found, f"no {name} line\n{stdout[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", found[-1])}


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_demo_delivers_every_channel_and_doubles_only_what_was_on_the_wire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AMQP_URL", AMQP_URL)  # the demo's child process reads these
    monkeypatch.setenv("DATABASE_URL", DATABASE_URL)
    argv = [sys.executable, "-m", "consumers", "demo", "--jobs", "400", "--pushes", "40"]
    run = run_to_end(argv, timeout=360)
    out = run.stdout
    assert run.returncode == 0, out[-4000:] + run.stderr[-2000:]
    for name in CHANNELS:
        figures = _fields(out, name)
        assert figures["intents"] == figures["delivered"] > 0, (name, figures)
        assert figures["lost"] == figures["beyond_window"] == 0, (name, figures)
        assert figures["duplicates"] <= figures["on_the_wire_at_kills"], (name, figures)
    assert _fields(out, "webpush")["refused"] == 0
    hooks = _fields(out, "webhooks")
    assert hooks["verified"] >= hooks["intents"] and hooks["rejected"] == 0
    assert re.search(r"^workers SIGKILLed +1$", out, re.MULTILINE), out[-4000:]
