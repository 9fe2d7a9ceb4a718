"""Where the time goes: py-spy samples the bench process while one variant consumes.

`--profile VARIANT` attaches py-spy (`record --nonblocking`, so the process
is not paused per sample) to the bench process for each run of VARIANT, only
while it consumes (publishing the backlog is not sampled), and writes the
collapsed stacks to a file. `top()` reads them back: the functions the
samples were in (self) and under (inclusive), as shares of all samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from proving.deadlines import ANSWER_S

SAMPLES_PER_SECOND = 200
ATTACH_SECONDS = 1.0
_LINE = re.compile(r":\d+\)")
# Frames every sample is under (the interpreter, the CLI, the event loop): not news.
_EVERYWHERE = (
    "runpy",
    "consumers/__main__",
    "consumers/cli.py",
    "bench/__init__",
    "runners.py",
    "BaseEventLoop.run_",
    "BaseEventLoop._run_once",
    "Handle._run",
)


def py_spy() -> str | None:
    """The py-spy executable beside this Python, or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


@asynccontextmanager
async def sampled(output: Path, pid: int | None = None) -> AsyncIterator[None]:
    """Sample process `pid` (this one, if None) into `output` (collapsed stacks) while
    the block runs."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("--profile needs py-spy (pip install 'idempotent-workers[bench]')")
    process = await asyncio.create_subprocess_exec(
        exe,
        "record",
        "--pid",
        str(os.getpid() if pid is None else pid),
        "--rate",
        str(SAMPLES_PER_SECOND),
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(output),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await asyncio.sleep(ATTACH_SECONDS)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        await asyncio.wait_for(process.wait(), ANSWER_S)  # SIGINT: it writes its profile


def top(paths: list[Path], *, entries: int = 15) -> str:
    """The `entries` largest self and inclusive shares over the stacks in `paths`."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    total = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
            n = int(count)
            total += n
            own[frames[-1]] += n
            for frame in set(frames):
                under[frame] += n
    if not total:
        return "profile: no samples"
    lines = [f"profile: {total} samples; self (the function itself):"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(entries)]
    lines.append("profile: inclusive (the function and what it called):")
    lines += [
        f"  {100 * n / total:5.1f}%  {frame}"
        for frame, n in under.most_common()
        if not any(mark in frame for mark in _EVERYWHERE)
    ][:entries]
    return "\n".join(lines)
