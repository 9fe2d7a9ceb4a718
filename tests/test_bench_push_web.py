"""The push bench's web variant on a few sends: the worker and the bare pywebpush sender
each reach the push service once per send (the bench checks it and exits otherwise),
both log a line per send to the file, and the summary line is there (no figure is
checked). Run as the command, in a process of its own (it configures logging)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.support import run_to_end


def test_the_worker_and_the_bare_pywebpush_sender_each_send_every_push_once(
    tmp_path: Path,
) -> None:
    log = tmp_path / "bench.log"
    argv = ["--platform", "web", "--sends", "40", "--runs", "1", "--log-file", str(log)]
    run = run_to_end([sys.executable, "-m", "proving.bench.push", *argv], timeout=240)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert re.search(r"round 1: bare pywebpush [\d,]+ sends/s", out), out
    assert re.search(r"round 1: worker [\d,]+ sends/s", out), out
    assert re.search(
        r"push_bench_web: worker=\d+ bare=\d+ ratio=[\d.]+ paired=[\d.]+ in_flight=\d+", out
    ), out
    sent = [line for line in log.read_text().splitlines() if '"push_sent"' in line]
    assert len(sent) == 2 * 40, len(sent)
