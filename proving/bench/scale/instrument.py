"""The bench's stopwatch inside a consumer process of the scale runs.

Imported by the processes the scale bench starts (the framework app and the
bare consumer), only when BENCH_SCALE_DIR names a directory: it installs
`Stopwatch` for the life of the process and, from a daemon thread, rewrites
`<dir>/<pid>.json` every PROGRESS_SECONDS and once more at exit with the
acks counted so far and the first delivery and last ack times.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path

from proving.bench.stopwatch import Stopwatch

DIR_ENV = "BENCH_SCALE_DIR"
PROGRESS_SECONDS = 0.1


def _write(watch: Stopwatch, path: Path) -> None:
    first, last = watch.span()
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps({"acked": watch.acked, "first": first, "last": last}))
    scratch.replace(path)  # the bench never reads half a file


_installed: list[AbstractContextManager[Stopwatch]] = []


def install(directory: str) -> Stopwatch:
    watch = Stopwatch()
    installed = watch.installed()
    installed.__enter__()  # for the whole process: it ends when the run does
    _installed.append(installed)  # dropped, the generator would close and uninstall it
    path = Path(directory) / f"{os.getpid()}.json"

    def report() -> None:
        while True:
            _write(watch, path)
            time.sleep(PROGRESS_SECONDS)

    threading.Thread(target=report, name="scale-progress", daemon=True).start()
    atexit.register(_write, watch, path)
    return watch


def install_from_env() -> Stopwatch | None:
    directory = os.environ.get(DIR_ENV)
    return install(directory) if directory else None
