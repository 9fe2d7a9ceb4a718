"""The wheel as a user gets it, in a fresh venv and an empty folder: the README, then the guide.

What `make wheel` does for the demo, done for what a new user meets first:
the wheel built from this tree, installed with the `push` and `testing`
extras into a venv of its own (nothing of the repository on its path), then
in an empty folder the README's quickstart as pasted (`tests/quickstart.py`)
and docs/testing.md's first section with that venv's pytest
(`tests/guide_examples.py`). A module or a file missing from the wheel, or a
step the README or the guide leaves out, fails here.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import AMQP_URL, DATABASE_URL
from tests.guide_examples import run_examples
from tests.quickstart import Quickstart, database_of_its_own, queue_of_its_own, run_quickstart
from tests.support import ROOT

# Building is seconds; the install is about 30 s from pip's cache, minutes from an index.
BUILD_DEADLINE_S = 300
INSTALL_DEADLINE_S = 600


@pytest.fixture
async def fresh_database() -> AsyncIterator[str]:
    async with database_of_its_own(DATABASE_URL) as url:
        yield url


@pytest.fixture
async def readme_queue() -> AsyncIterator[str]:
    async with queue_of_its_own(AMQP_URL) as name:
        yield name


def _run(args: list[str], *, timeout: float) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ of a fresh venv holding the wheel built from this tree, [push,testing]."""
    base = tmp_path_factory.mktemp("wheel")
    _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(base / "dist"), str(ROOT)],
        timeout=BUILD_DEADLINE_S,
    )
    (wheel,) = (base / "dist").glob("*.whl")
    _run([sys.executable, "-m", "venv", str(base / "venv")], timeout=BUILD_DEADLINE_S)
    bin_dir = base / "venv" / "bin"
    _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[push,testing]"],
        timeout=INSTALL_DEADLINE_S,
    )
    return bin_dir


@pytest.mark.slow
async def test_the_wheel_runs_the_readme_quickstart_and_the_testing_guide_in_an_empty_folder(
    tmp_path: Path, wheel_venv: Path, fresh_database: str, readme_queue: str
) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    quick = Quickstart.from_readme((ROOT / "README.md").read_text())
    await run_quickstart(
        quick.isolated(
            {
                quick.exported("DATABASE_URL"): fresh_database,
                quick.exported("AMQP_URL"): AMQP_URL,
                quick.queue: readme_queue,
            }
        ),
        folder,
        bin_dir=wheel_venv,
    )
    output = run_examples(folder, bin_dir=wheel_venv, amqp_url=AMQP_URL, database_url=DATABASE_URL)
    assert "warning" not in output.lower(), output
