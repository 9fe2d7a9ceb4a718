"""The webhook bench's code path, on a few sends: the worker and the bare clients each reach
the receiver once per send with distinct webhook-ids (the bench checks it and exits
otherwise), both log a line per send to the file, and the summary line is there (no
figure is checked). Run as the command, in a process of its own (it configures logging)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.support import run_to_end


@pytest.mark.parametrize("endpoints", [1, 3])
def test_the_worker_and_the_bare_client_each_send_every_webhook_once(
    endpoints: int, tmp_path: Path
) -> None:
    log = tmp_path / "bench.log"
    argv = ["--sends", "60", "--runs", "1", f"--endpoints={endpoints}", "--log-file", str(log)]
    run = run_to_end([sys.executable, "-m", "proving.bench.webhooks", *argv], timeout=240)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert re.search(r"round 1: bare [\d,]+ sends/s", out), out
    assert re.search(r"round 1: bare_httpx [\d,]+ sends/s", out), out
    assert re.search(r"round 1: worker [\d,]+ sends/s", out), out
    assert re.search(
        rf"webhook_bench: worker=\d+ bare=\d+ bare_httpx=\d+ ratio=[\d.]+ paired=[\d.]+"
        rf" ratio_httpx=[\d.]+ endpoints={endpoints}",
        out,
    ), out
    sent = [line for line in log.read_text().splitlines() if '"webhook_sent"' in line]
    assert len(sent) == 3 * 60, len(sent)  # the worker, bare aiohttp, bare httpx
