"""The guides say what is, and stay short enough to read.

docs/performance.md gives the current figures, their commands and how to
reproduce them, not a log of every campaign: at most 300 lines. CHANGELOG.md
follows Keep a Changelog, one to three lines an entry: the evidence behind a
change belongs in its commit message (STYLE.md, "docs that narrate history").
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PERFORMANCE = ROOT / "docs" / "performance.md"
CHANGELOG = ROOT / "CHANGELOG.md"
MAX_PERFORMANCE_LINES = 300
MAX_ENTRY_LINES = 3
KEEP_A_CHANGELOG_SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}

_ITEM = re.compile(r"^(?:[-*+]|\d+\.)\s")


def changelog_entries(text: str) -> list[list[str]]:
    """Each top-level list item with its continuation lines (indented, blank lines skipped).

    A nested item, an indented paragraph or code block after a blank line all
    continue the item above them; a line that starts at the margin ends it.
    """
    entries: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if _ITEM.match(line):
            current = [line]
            entries.append(current)
        elif not line.strip():
            continue
        elif current is not None and line[0] in " \t":
            current.append(line)
        else:
            current = None
    return entries


def test_an_entry_counts_its_continuation_lines() -> None:
    text = (
        "### Fixed\n"
        "- one line\n"
        "- three\n  lines\n  in all\n"
        "- a first line\n  a second\n\n  a paragraph after a blank line\n"
        "    ```\n    a code block\n    ```\n"
        "\n"
        "A paragraph at the margin is no entry's.\n"
        "1. a numbered item\n   - a nested one\n"
    )
    assert [len(entry) for entry in changelog_entries(text)] == [1, 3, 6, 2]


def test_the_performance_guide_is_at_most_300_lines() -> None:
    lines = len(PERFORMANCE.read_text().splitlines())
    assert lines <= MAX_PERFORMANCE_LINES, (
        f"docs/performance.md has {lines} lines (at most {MAX_PERFORMANCE_LINES}): give the"
        " current figures; the campaigns' history goes in commit messages"
    )


def test_no_changelog_entry_is_longer_than_three_lines() -> None:
    long = [
        f"{len(entry)} lines: {entry[0][:80]}"
        for entry in changelog_entries(CHANGELOG.read_text())
        if len(entry) > MAX_ENTRY_LINES
    ]
    assert not long, (
        f"CHANGELOG.md entries longer than {MAX_ENTRY_LINES} lines (say what changed for a user;"
        " the evidence goes in the commit message):\n" + "\n".join(long)
    )


def test_the_changelog_has_keep_a_changelog_sections_only() -> None:
    text = CHANGELOG.read_text()
    assert "## [Unreleased]" in text
    sections = set(re.findall(r"^### (.+)$", text, re.M))
    assert sections <= KEEP_A_CHANGELOG_SECTIONS, sorted(sections - KEEP_A_CHANGELOG_SECTIONS)
