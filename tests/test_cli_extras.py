"""A tool whose extra is not installed says which extra to install, not a traceback."""

from __future__ import annotations

import subprocess
import sys

# Run in a fresh interpreter in which httpx (the demo extra's client) cannot be
# imported, as in `pip install idempotent-workers` without `[demo]`.
WITHOUT_HTTPX = """
import sys
class NoHttpx:
    def find_spec(self, name, path=None, target=None):
        if name == "httpx" or name.startswith("httpx."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoHttpx())
from consumers.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_demo_without_its_extra_names_the_extra_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_HTTPX, "demo", "--jobs", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "pip install 'idempotent-workers[demo]'" in done.stderr, done.stderr
    assert "httpx" in done.stderr
