"""The README stays one screen and says only what exists.

`mkdocs build --strict` (`make docs`) checks the links inside docs/; the
README lives outside it, so its links, its `make` commands and its length are
held here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 150


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", text, re.M)}


def test_the_readme_is_at_most_150_lines() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; the guides live in docs/"


def test_every_make_command_in_the_readme_is_a_makefile_target() -> None:
    named = set(re.findall(r"\bmake ([a-z][\w-]*)", README.read_text()))
    assert {"demo", "test"} <= named, "the README lost its two set-up commands"
    missing = named - _makefile_targets()
    assert not missing, f"README.md names make targets the Makefile lacks: {sorted(missing)}"


def test_every_relative_link_in_the_readme_names_a_file() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links to no guide"
    missing = [link for link in local if not (ROOT / link).is_file()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
