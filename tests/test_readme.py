"""The README stays one screen, says only what exists, and its quickstart runs as pasted.

`mkdocs build --strict` (`make docs`) checks the links inside docs/; the
README lives outside it, so its links, its `make` commands and its length are
held here. Its quickstart (the handler, its table, the commands, the
publisher) is run as a reader runs it (`tests/quickstart.py`), so it cannot
drift from the code again.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import AMQP_URL, DATABASE_URL
from tests.quickstart import (
    Quickstart,
    database_of_its_own,
    queue_of_its_own,
    run_quickstart,
)

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


# -- the quickstart, run as pasted -------------------------------------------


def _code(source: str) -> str:
    """The module's statements: no docstring, no `from __future__`, no comments."""
    module = ast.parse(source)
    body = [
        node
        for node in module.body
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
    ]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def _statements(sql: str) -> list[str]:
    text = re.sub(r"--[^\n]*", "", sql)
    return [" ".join(s.split()) for s in text.split(";") if s.strip()]


@pytest.fixture
async def fresh_database() -> AsyncIterator[str]:
    async with database_of_its_own(DATABASE_URL) as url:
        yield url


@pytest.fixture
async def readme_queue() -> AsyncIterator[str]:
    async with queue_of_its_own(AMQP_URL) as name:
        yield name


def test_the_readme_app_and_table_are_the_deploy_example() -> None:
    quick = Quickstart.from_readme(README.read_text())
    example = ROOT / "deploy" / "example"
    assert {"shipments.py", "schema.sql", "publish.py"} <= set(quick.files), (
        f"the README's files: {sorted(quick.files)}"
    )
    assert _code(quick.files["shipments.py"]) == _code((example / "shipments.py").read_text())
    assert _statements(quick.files["schema.sql"]) == _statements(
        (example / "schema.sql").read_text()
    )


def test_the_readme_says_how_to_install_from_pypi_and_from_a_clone() -> None:
    text = README.read_text()
    assert "pip install 'idempotent-workers[push]'" in text
    assert "pip install '.[push]'" in text


async def test_the_readme_quickstart_runs_as_pasted(
    tmp_path: Path, fresh_database: str, readme_queue: str
) -> None:
    """Its SQL, handler, commands and publisher, in order, against the real services."""
    quick = Quickstart.from_readme(README.read_text())
    isolated = quick.isolated(
        {
            quick.exported("DATABASE_URL"): fresh_database,
            quick.exported("AMQP_URL"): AMQP_URL,
            quick.queue: readme_queue,
        }
    )
    await run_quickstart(isolated, tmp_path, bin_dir=Path(sys.executable).parent)
