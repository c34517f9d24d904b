"""README.md and docs/: every relative link and #anchor resolves, every pointer the code prints or
comments ("see README, 'Dropped events'", "docs/design.md, 'Attribution'") names a heading that exists,
and the README stays short (the rest lives in docs/, indexed by docs/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 260

LINK = re.compile(r"\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)\)")
POINTER = re.compile(r"""(README|docs/[\w.-]+\.md)[,:] (?:'([^']+)'|"([^"]+)")""")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where a link is a link."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def headings(text: str) -> list[str]:
    out, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+?)\s*#*$", line)):
            out.append(m.group(1))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but - and _ removed,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path.read_text()):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def test_slug_is_githubs():
    assert slug("Without BPF: `--diskstats`") == "without-bpf---diskstats"
    assert slug("Per process: I/O wait, page-cache hits, fsync, throttling (on by default)") == \
        "per-process-io-wait-page-cache-hits-fsync-throttling-on-by-default"
    assert slug("Is the disk slowing training?") == "is-the-disk-slowing-training"


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines: move detail into docs/ (index: docs/README.md)"


def test_every_docs_page_is_in_the_index():
    index = (DOCS / "README.md").read_text()
    listed = {m.split("#")[0] for m in LINK.findall(prose(index))}
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md does not list {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path):
    bad = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):        # http:, https:, mailto:: not checked offline
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: broken links:\n  " + "\n  ".join(bad)


def pointers() -> list[tuple[str, str, str]]:
    out = []
    for top in ("tracer", "tests", "scripts", "deploy", "bpf"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".c", ".h", ".json", ".list", ".sh") or path == Path(__file__):
                continue
            for m in POINTER.finditer(path.read_text(errors="replace")):
                out.append((str(path.relative_to(ROOT)), m.group(1), m.group(2) or m.group(3)))
    return out


def test_pointers_name_headings():
    """What the report prints ("see README, 'Dropped events'") and what comments cite must exist."""
    found = pointers()
    assert any(f == "tracer/views/report.py" and page == "README" for f, page, _ in found), \
        "no README pointer found in tracer/views/report.py: has the pattern changed?"
    bad = []
    for where, page, heading in found:
        path = README if page == "README" else ROOT / page
        if not path.exists():
            bad.append(f"{where}: {page} does not exist")
        elif heading not in headings(path.read_text()):
            bad.append(f"{where}: {page} has no heading {heading!r}")
    assert not bad, "pointers to missing headings:\n  " + "\n  ".join(sorted(set(bad)))
