"""The suite's own shape under pytest-xdist: the `slow` tests never run two at once.

`make test` runs two xdist workers with `--dist loadgroup`; tests/conftest.py
puts every `slow` test (each starts services of its own) in one group, which
xdist gives to one worker. This runs a small suite through the same hook and
reads which worker ran what.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

PYTEST = (sys.executable, "-m", "pytest")

SUITE = """
import pytest

@pytest.mark.slow
def test_heavy_one() -> None: ...

@pytest.mark.slow
def test_heavy_two() -> None: ...

@pytest.mark.slow
def test_heavy_three() -> None: ...

def test_light_one() -> None: ...

def test_light_two() -> None: ...

def test_light_three() -> None: ...
"""


def test_slow_tests_share_one_xdist_worker(tmp_path: Path) -> None:
    (tmp_path / "test_shape.py").write_text(SUITE)
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: heavy\n")
    run = subprocess.run(
        [*PYTEST, "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ran = re.findall(r"\[(gw\d)\] .*?PASSED \S*test_shape\.py::(test_\w+)", run.stdout)
    workers = {name: worker for worker, name in ran}
    assert len(workers) == 6, run.stdout
    heavy = {workers[f"test_heavy_{n}"] for n in ("one", "two", "three")}
    assert len(heavy) == 1, f"slow tests ran on {sorted(heavy)}:\n{run.stdout}"
