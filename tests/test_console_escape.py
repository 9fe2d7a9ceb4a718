"""What the console shows of a publisher's text: never markup, every control character seen."""

from __future__ import annotations

from console.escape import shown_body, visible


def test_markup_stays_text_and_controls_are_written_out_and_marked() -> None:
    shown = str(visible('<b onclick="x">\x1b[2J\x00\u202e\u200b\udcff</b>'))
    assert "<b" not in shown and "&lt;b onclick=&quot;x&quot;&gt;" in shown
    for escape in ("\\x1b", "\\x00", "\\u202e", "\\u200b", "\\xff"):
        assert f'<span class="esc">{escape}</span>' in shown
    assert not any(char in shown for char in "\x1b\x00\u202e\u200b")


def test_a_json_body_is_pretty_and_a_broken_one_is_shown_as_it_came() -> None:
    pretty, is_json = shown_body(b'{"a": "\xe2\x80\xae<i>", "b": [1]}')
    assert is_json and "\n" in pretty
    assert '<span class="esc">\\u202e</span>&lt;i&gt;' in pretty
    raw, is_json = shown_body(b'{"a": \xff\n')
    assert not is_json and '<span class="esc">\\xff</span>' in raw and "\n" in raw
