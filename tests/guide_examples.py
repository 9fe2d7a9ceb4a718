"""The first section of docs/testing.md ("Testing your own handlers"), run as a reader runs it.

Its files (conftest.py, the test modules) are saved beside the README's
`shipments.py` and `schema.sql`, as the guide says, and `pytest` is run
there, a folder with no configuration of ours: every test of the section must
pass. The services come from `TEST_AMQP_URL` and `TEST_DATABASE_URL`, as the
guide says; nothing else of the caller's environment reaches it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.code_blocks import code_blocks, section, write_named
from tests.quickstart import Quickstart
from tests.support import ROOT

GUIDE = ROOT / "docs" / "testing.md"
FIRST_SECTION = "Testing your own handlers"
# pytest and its first run of the fixtures, on a busy machine
PYTEST_DEADLINE_S = 240


def write_examples(folder: Path) -> int:
    """Save the README's files and the section's into `folder`; return its number of tests."""
    for name, text in Quickstart.from_readme((ROOT / "README.md").read_text()).files.items():
        (folder / name).write_text(text)
    text = section(GUIDE.read_text(), FIRST_SECTION)
    written = write_named(code_blocks(text), folder)
    assert "conftest.py" in written, f"the section saves no conftest.py: {written}"
    return len(re.findall(r"^async def test_|^def test_", text, re.M))


def run_examples(folder: Path, *, bin_dir: Path, amqp_url: str, database_url: str) -> str:
    """`pytest` from `bin_dir` in `folder`; fails unless every test of the section passed."""
    expected = write_examples(folder)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "TEST_AMQP_URL": amqp_url,
        "TEST_DATABASE_URL": database_url,
    }
    done = subprocess.run(
        [str(bin_dir / "pytest"), "-p", "no:cacheprovider", "-q"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=PYTEST_DEADLINE_S,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"pytest exited {done.returncode}:\n{output}"
    assert re.search(rf"\b{expected} passed\b", output), f"expected {expected} passed:\n{output}"
    return output
