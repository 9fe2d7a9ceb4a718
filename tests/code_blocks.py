"""The fenced code blocks of a Markdown page, for the tests that run a page as written.

A block whose first line is a comment naming a file (`# shipments.py`,
`-- schema.sql`, `# conftest.py`, `# pytest.ini`) is that file's text: the reader is meant to
save it under that name, and the tests do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```(\w*)\s*$")
_NAMED = re.compile(r"^(?:#|--)\s*([\w.-]+\.(?:py|sql|ini))\b")


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeBlock:
    lang: str
    text: str
    line: int  # where its fence opens, 1-based

    @property
    def file_name(self) -> str | None:
        """The file the block's first line names, if it names one."""
        first = self.text.split("\n", 1)[0]
        match = _NAMED.match(first)
        return match.group(1) if match else None


def code_blocks(markdown: str) -> list[CodeBlock]:
    """Every fenced block, in order (the fences themselves at the start of a line)."""
    blocks: list[CodeBlock] = []
    lang: str | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(markdown.splitlines(), start=1):
        fence = _FENCE.match(line)
        if lang is None and fence:
            lang, start, body = fence.group(1), number, []
        elif lang is not None and line.strip() == "```":
            blocks.append(CodeBlock(lang=lang, text="\n".join(body) + "\n", line=start))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def section(markdown: str, heading: str) -> str:
    """The text under the `## heading` line, up to the next heading of that level or above
    (a `#` line inside a code block is a comment, not a heading)."""
    lines = markdown.splitlines()
    start = lines.index(f"## {heading}") + 1
    end, fenced = len(lines), False
    for number in range(start, len(lines)):
        if lines[number].startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"^#{1,2} ", lines[number]):
            end = number
            break
    return "\n".join(lines[start:end]) + "\n"


def write_named(blocks: list[CodeBlock], folder: Path) -> list[str]:
    """Save every block that names its file into `folder`; return the names, in order."""
    names = []
    for block in blocks:
        if block.file_name is not None:
            (folder / block.file_name).write_text(block.text)
            names.append(block.file_name)
    return names
