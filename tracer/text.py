"""Untrusted text made safe for a terminal: comm, cgroup and container names, paths, labels, hosts.

Base layer: no iotrace imports.  Any unprivileged process can name itself
(prctl(PR_SET_NAME)) or its cgroup with escape sequences, newlines or
backspaces; printed raw they clear the screen, fake rows of a table or set
the window title of whoever reads iotrace's output.  Every text view (tables,
top, report, plot titles, CSV, the start lines) passes such strings through
safe(); JSON keeps the exact text, escaped by the JSON encoder.
"""

from __future__ import annotations


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def safe(text: object) -> str:
    """`text` (str() of it) with every character that is not printable shown as an escape: "\\x1b[2J"
    stays readable and inert; newlines, tabs, C1 controls, bidi overrides and other format characters
    too.  A backslash itself is kept (the result is for eyes, not for parsing back)."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else _escape(c) for c in s)
