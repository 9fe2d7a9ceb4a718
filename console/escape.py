"""What the console shows of a message, made safe and visible for a browser.

Jinja2's autoescape keeps a dead letter's text from becoming markup. That is
not enough: an ANSI escape, a NUL or a right-to-left override would still
reach the page raw, invisible or reordering what follows. `visible()` writes
each such character as `consumers.commands.printable.printable` writes it for a
terminal (`\\x1b`, `\\x00`, `\\u202e`), HTML-escapes the rest, and marks the
escapes so they stand out (`<span class="esc">`).
"""

from __future__ import annotations

import html
import json

from markupsafe import Markup

from consumers.commands.printable import printable

SHOWN_BODY_BYTES = 256 * 1024  # a bigger body is shown up to here, and said to be cut


def visible(value: str | bytes | bytearray | None, *, backslash: bool = True) -> Markup:
    """`value` HTML-escaped, every control or invisible character written out and marked.

    `backslash=False` leaves a backslash as it is: in JSON that `json.dumps`
    wrote, a backslash starts one of JSON's own escapes (`\\u0000`), already visible.
    """
    if value is None:
        return Markup("-")
    text = value if isinstance(value, str) else bytes(value).decode("utf-8", "surrogateescape")
    if text.isprintable() and "\\" not in text:
        return Markup(html.escape(text, quote=True))
    parts = []
    for char in text:
        shown = printable(char)
        if shown == char or (char == "\\" and not backslash):
            parts.append(html.escape(char, quote=True))
        else:
            parts.append(f'<span class="esc">{html.escape(shown)}</span>')
    return Markup("".join(parts))


def visible_lines(text: str, *, backslash: bool = True) -> Markup:
    """As `visible`, line by line: the line breaks stay line breaks."""
    return Markup("\n").join(visible(line, backslash=backslash) for line in text.split("\n"))


def shown_body(body: bytes) -> tuple[Markup, bool]:
    """The body for a `<pre>`: pretty JSON when it is JSON; and whether it was."""
    part = body[:SHOWN_BODY_BYTES]
    try:
        pretty = json.dumps(json.loads(part), indent=2, ensure_ascii=False)
    except ValueError:
        return visible_lines(part.decode("utf-8", "surrogateescape")), False
    return visible_lines(pretty, backslash=False), True
