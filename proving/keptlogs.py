"""Keep the log of a worker that exited non-zero, before its run's directory is removed.

A chaos run, the fuzz run and the tests write worker logs into a directory
they remove when they end; a worker that exited unexpectedly would take the
only evidence of why with it. `keep_log` copies the log to
`$TMPDIR/iw-kept-logs/` (outside any run directory) and prints its last lines.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

KEPT_DIR = Path(tempfile.gettempdir()) / "iw-kept-logs"
TAIL_LINES = 30


def keep_log(source: Path, name: str, why: str, *, tail: int = TAIL_LINES) -> Path:
    """Copy `source` to `KEPT_DIR/name`; print `why` and the log's last `tail` lines."""
    KEPT_DIR.mkdir(parents=True, exist_ok=True)
    kept = KEPT_DIR / name
    if source.exists():
        shutil.copyfile(source, kept)
        lines = source.read_text(errors="replace").splitlines()[-tail:]
    else:
        kept.write_text(f"(no log at {source})\n")
        lines = []
    print(f"worker log kept: {why}: {kept}; its last {len(lines)} lines:", file=sys.stderr)
    for line in lines:
        print(f"  | {line}", file=sys.stderr)
    sys.stderr.flush()
    return kept
