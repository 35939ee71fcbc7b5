"""The link's layers hold for every import, those inside functions included.

``scaleflu.link`` (pure Python) is the ground, ``scaleflu.radio`` (GNU Radio) stands on it, the
link kinds (``scaleflu.linkkinds``) on both, and the link's command lines on top. A module
imports its own layer or lower ones, never a higher one; no modules of these layers import each
other in a circle, even through imports made inside functions. An import inside a function is
allowed only to defer GNU Radio (or torch, ray, stable-baselines3): ``ALLOW_DEFERRED``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "python" / "scaleflu"

# lowest first: a module may import modules of its own layer and of the layers before it
LAYERS: list[tuple[str, ...]] = [
    ("scaleflu.link",),
    ("scaleflu.radio",),
    ("scaleflu.linkkinds",),
    ("scaleflu.cli.linktest", "scaleflu.cli.medium"),
]

# Imports that may wait inside a function, and why: the GNU Radio side (gnuradio, pmt, and
# scaleflu.radio, which imports them: the layers above it run without GNU Radio until a radio
# link kind is opened; gr-uhd is optional within it), torch, ray and stable-baselines3 (heavy).
ALLOW_DEFERRED = ("gnuradio", "pmt", "scaleflu.radio", "torch", "ray", "stable_baselines3")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int | None:
    for i, roots in enumerate(LAYERS):
        if any(module == r or module.startswith(r + ".") for r in roots):
            return i
    return None


def _resolve(module: str, name: str) -> str:
    """``from module import name``: the module ``module.name`` when there is one, else module."""
    sub = PKG.parent / (module.replace(".", "/") + "/" + name)
    return f"{module}.{name}" if sub.is_dir() or sub.with_suffix(".py").exists() else module


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module imported, line, inside a function or class) of every import in ``path``."""
    here = _module_name(path)
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, deferred) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                mod = child.module or ""
                if child.level:
                    base = here.split(".")
                    base = base[: len(base) - child.level + (1 if is_pkg else 0)]
                    mod = ".".join([*base, mod] if mod else base)
                out.extend((_resolve(mod, a.name), child.lineno, deferred) for a in child.names)
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            visit(child, deferred or inner)

    visit(ast.parse(path.read_text()), False)
    return out


def _files() -> dict[str, Path]:
    return {
        _module_name(p): p
        for p in PKG.rglob("*.py")
        if "bindings" not in p.parts and _layer(_module_name(p)) is not None
    }


def test_every_import_stays_on_its_layer_or_below():
    bad = []
    for name, path in _files().items():
        mine = _layer(name)
        for target, line, _ in _imports(path):
            if target.split(".")[0] != "scaleflu":
                continue
            theirs = _layer(target)
            if theirs is None or theirs > mine:  # above, or a part of scaleflu the link never needs
                bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
    assert bad == [], "\n".join(bad)


def test_imports_inside_functions_only_defer_gnu_radio_or_heavy_packages():
    bad = []
    for path in _files().values():
        if path.name.startswith("qa_"):  # gr_unittest scripts run by ctest, not library code
            continue
        for target, line, deferred in _imports(path):
            if deferred and not any(
                target == a or target.startswith(a + ".") for a in ALLOW_DEFERRED
            ):
                bad.append(f"{path.relative_to(PKG.parent)}:{line} defers {target}")
    assert bad == [], "\n".join(bad)


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_circle_even_through_imports_inside_functions():
    files = _files()
    graph = {
        name: {t for t, _, _ in _imports(path) if t in files and t != name}
        for name, path in files.items()
    }
    circle = _circle(graph)
    assert circle is None, " -> ".join(circle or [])


def test_the_checks_see_what_they_check():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    deferred = [(t, d) for t, _, d in _imports(PKG / "linkkinds.py")]
    assert ("scaleflu.radio.links", True) in deferred  # an import inside a function
    relative = [t for t, _, _ in _imports(PKG / "radio" / "links" / "shared.py")]
    assert "scaleflu.radio.medium.port" in relative and "scaleflu.radio.phy" in relative
    assert _layer("scaleflu.radio.links.shared") == 1 and _layer("scaleflu.linkkinds") == 2
