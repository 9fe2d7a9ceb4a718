"""Every command's `--help` says what it does and lists every flag its real parser takes.

The walk covers the CLI's own parser, command by command and subcommand by
subcommand, and for each tool the CLI hands its arguments to (serve, api-key,
console, bench, chaos: `consumers.cli.TOOLS`) the parser that tool builds, the
one that will read the flags. Each is run as a user runs it: the installed
console script, `idempotent-workers WORDS... --help`.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator

import pytest

from consumers.cli import TOOLS, _parser, load_entry
from tests.support import ROOT

SCRIPT = ROOT / ".venv" / "bin" / "idempotent-workers"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(
    parser: argparse.ArgumentParser, words: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(the words that name a command, the parser that reads its flags), depth first."""
    yield words, parser
    for name, sub in _subcommands(parser).items():
        if not words and name in TOOLS:
            tool = TOOLS[name]
            for word, entry in tool.parsers.items():
                real = load_entry(name, entry, tool.extra)()
                yield from _walk(real, (name, word) if word else (name,))
        else:
            yield from _walk(sub, (*words, name))


COMMANDS = list(_walk(_parser(), ()))


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_walk_reaches_every_tool_and_subcommand() -> None:
    named = {" ".join(words) for words, _ in COMMANDS}
    for expected in ("run", "dlq archive", "serve", "api-key create", "console token revoke"):
        assert expected in named, sorted(named)
    assert {"bench", "chaos"} <= named


@pytest.mark.parametrize(
    ("words", "parser"), COMMANDS, ids=[" ".join(words) or "(top)" for words, _ in COMMANDS]
)
def test_help_says_what_the_command_does_and_lists_every_flag(
    words: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    done = subprocess.run(
        [str(SCRIPT), *words, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    shown = _flat(done.stdout)
    assert parser.description, f"{words}: no description"
    assert _flat(parser.description) in shown, (parser.description, done.stdout)
    assert "positional arguments: args" not in shown, done.stdout
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name in action.choices:
                assert name in shown, (name, done.stdout)
        elif action.option_strings:
            for flag in action.option_strings:
                assert flag in shown, (flag, done.stdout)
        else:
            assert str(action.metavar or action.dest) in shown, (action.dest, done.stdout)
        assert action.help, f"{' '.join(words)}: {action.option_strings or action.dest} has no help"
