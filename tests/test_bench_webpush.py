"""The Web Push baseline bench's code path, on a few sends: both senders reach the fake,
every request is counted, and the summary line is there (no figure is checked)."""

from __future__ import annotations

import re

import pytest

from proving.bench import webpush_baseline


def test_the_bare_sender_and_the_provider_each_send_every_push_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    webpush_baseline.main(["--sends", "40", "--concurrency", "4", "--runs", "1"])
    out = capsys.readouterr().out
    assert re.search(r"round 1: bare [\d,]+ sends/s, provider_only [\d,]+ sends/s", out), out
    assert re.search(r"webpush_baseline: bare=\d+ provider_only=\d+ provider/bare=[\d.]+", out)
