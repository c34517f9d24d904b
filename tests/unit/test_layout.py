"""The package's shape: no import cycle (imports inside functions count), no module imports another's
`_private` names, the reference outside the product, and the layers contract that `make lint` checks."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "tracer"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every tracer import in `path`, at any depth."""
    out = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "tracer"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] != "tracer":
                continue
            names = [a.name for a in node.names]
            # `from tracer.x import y` may import the module tracer.x.y
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
            out += [(s, [], node.lineno) for s in subs]
            rest = [n for n in names if f"{base}.{n}" not in known]
            if rest:
                out.append((base, rest, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for target, _, _ in imports_of(name, path, known):
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name and not name.startswith(target + "."):
                edges[name].add(target)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_in_tracer_counting_imports_inside_functions():
    edges = graph()
    assert len(edges) > 40 and edges["tracer.cli.trace"], "the graph must see the package's imports"
    assert find_cycle(edges) is None, f"import cycle: {' -> '.join(find_cycle(edges))}"


def test_no_module_imports_another_modules_private_names():
    mods = modules()
    known = set(mods)
    bad = []
    for name, path in mods.items():
        for target, names, line in imports_of(name, path, known):
            if target != name:
                bad += [f"{path.relative_to(ROOT)}:{line}: {n} from {target}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_the_reference_is_not_in_the_product():
    product = [p for p in (ROOT / "tracer").rglob("*.py") if "groundtruth" in p.read_text() or "groundtruth" in p.name]
    assert not product, product
    assert not (ROOT / "bpf" / "stamps.bpf.c").exists()


@pytest.mark.skipif(shutil.which("lint-imports") is None and not (ROOT / ".venv/bin/lint-imports").exists(),
                    reason="import-linter not installed (make setup installs it)")
def test_the_layers_contract_holds():
    exe = shutil.which("lint-imports") or str(ROOT / ".venv/bin/lint-imports")
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 kept, 0 broken" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_pyproject_lists_every_package_and_maps_the_bpf_sources():
    """The package list is explicit (tracer.bpf maps to bpf/, outside tracer/): a new subpackage must join it,
    or `pip install .` would leave it out."""
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {"tracer"} | {f"tracer.{p.parent.name}" for p in (ROOT / "tracer").glob("*/__init__.py")}
    assert set(conf["packages"]) == found | {"tracer.bpf"}
    assert conf["package-dir"] == {"tracer.bpf": "bpf"}
    for pattern in conf["package-data"]["tracer.bpf"]:
        assert list((ROOT / "bpf").glob(pattern)), pattern
    assert {p.name for p in (ROOT / "bpf").iterdir()} <= {
        p.name for pattern in conf["package-data"]["tracer.bpf"] for p in (ROOT / "bpf").glob(pattern)}
