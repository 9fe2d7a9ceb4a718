"""What the CLI prints of a message, made safe for a terminal.

Message ids, tenants, errors and bodies come from publishers. Printed raw, an
ANSI escape sequence in one can clear the screen, retitle the window, hide a
line or fake one; a NUL cuts a line short in some tools; a right-to-left
override reverses what follows. `printable()` writes every such character as
a Python escape (`\\x1b`, `\\x00`, `\\u202e`) and a backslash as `\\\\`, so what
is printed reads back to exactly what was received. With `keep_lines`, a
newline and a tab stay as they are (a body's lines, `dlq show`): a terminal
moves on a line or a column for them, and acts on nothing else.
"""

from __future__ import annotations

import unicodedata
from functools import cache

# Bytes that are not UTF-8, read with surrogateescape (as `bytes` here, or by
# consumers.broker.headers.read_leniently for AMQP short strings): printed as the byte.
_BAD_BYTES = range(0xDC80, 0xDD00)


@cache
def _escape(char: str) -> str:
    code = ord(char)
    if char == "\\":
        return "\\\\"
    if code in _BAD_BYTES:
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x20 or 0x7F <= code < 0xA0:
        return f"\\x{code:02x}"
    # Format (Cf: bidi overrides, zero-width), line and paragraph separators,
    # surrogates, private use and unassigned: invisible or misleading on a terminal.
    if unicodedata.category(char) in ("Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return char


def is_safe(char: str) -> bool:
    """Whether a terminal shows `char` as itself: no control, format or invisible character."""
    return char == "\\" or _escape(char) == char


def printable(value: str | bytes | bytearray | None, *, keep_lines: bool = False) -> str:
    """`value` with every control or invisible character escaped; bytes not UTF-8 as `\\xNN`.

    `keep_lines`: newlines and tabs are kept as they are."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else bytes(value).decode("utf-8", "surrogateescape")
    if text.isprintable() and "\\" not in text:
        return text
    if keep_lines:
        return "".join(char if char in "\n\t" else _escape(char) for char in text)
    return "".join(_escape(char) for char in text)
