"""tracer.text.safe: what an untrusted name may contain, and what reaches the terminal."""

import pytest

from tracer.text import safe


@pytest.mark.parametrize(("raw", "shown"), [
    ("python", "python"),
    ("pt_data_worker", "pt_data_worker"),
    ("a b", "a b"),                                   # a space is printable
    ("\x1b[2J\x1b[H\x1b[31mPWN", "\\x1b[2J\\x1b[H\\x1b[31mPWN"),
    ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),       # window title (OSC ... BEL)
    ("row\nfake row", "row\\x0afake row"),
    ("a\rb\bc\td", "a\\x0db\\x08c\\x09d"),
    ("\x9b2J", "\\x9b2J"),                             # the 8-bit CSI
    ("evil\u202etxt.exe", "evil\\u202etxt.exe"),      # a bidi override
    ("\u2028", "\\u2028"),
    ("caf\u00e9 \u4e2d", "caf\u00e9 \u4e2d"),          # printable non-ASCII stays as it is
])
def test_safe_table(raw, shown):
    assert safe(raw) == shown


def test_safe_output_has_no_control_characters():
    every = "".join(chr(c) for c in range(0x2100))
    assert safe(every).isprintable()


def test_safe_takes_any_object():
    assert safe(42) == "42"
    assert safe(None) == "None"
