"""docs/testing.md's first section runs as written: its conftest.py and tests, with pytest."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.code_blocks import code_blocks, section
from tests.conftest import AMQP_URL, DATABASE_URL
from tests.guide_examples import FIRST_SECTION, GUIDE, run_examples


def test_the_guide_opens_with_testing_your_own_handlers() -> None:
    headings = [line for line in GUIDE.read_text().splitlines() if line.startswith("## ")]
    assert headings[0] == f"## {FIRST_SECTION}", headings


def test_every_python_block_of_the_first_section_is_a_whole_file() -> None:
    blocks = code_blocks(section(GUIDE.read_text(), FIRST_SECTION))
    python = [b for b in blocks if b.lang == "python"]
    assert len(python) >= 3
    unnamed = [b.line for b in python if b.file_name is None]
    assert unnamed == [], f"python blocks that name no file (lines of the section): {unnamed}"


def test_the_first_sections_examples_pass_as_written(tmp_path: Path) -> None:
    output = run_examples(
        tmp_path,
        bin_dir=Path(sys.executable).parent,
        amqp_url=AMQP_URL,
        database_url=DATABASE_URL,
    )
    assert "warning" not in output.lower(), output
