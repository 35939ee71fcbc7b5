"""No import circles inside scaleflu: module-level imports form a DAG; command lines live in
``scaleflu.cli`` alone and no module outside it imports one, even lazily."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "python" / "scaleflu"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(node: ast.AST, here: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = here.split(".")
            base = base[: len(base) - node.level + (1 if is_pkg else 0)]
            mod = ".".join([*base, node.module] if node.module else base)
        else:
            mod = node.module or ""
        return [mod] + [f"{mod}.{a.name}" for a in node.names]
    return []


def _graph(lazy: bool) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PKG.rglob("*.py") if "bindings" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        nodes = ast.walk(tree) if lazy else tree.body
        deps: set[str] = set()
        for node in nodes:
            for t in _targets(node, name, path.name == "__init__.py"):
                if t in files and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_module_level_imports_have_no_cycle():
    assert _cycle(_graph(lazy=False)) is None


def test_report_and_table2_do_not_import_each_other_even_lazily():
    g = _graph(lazy=True)
    assert "scaleflu.experiments.table2" not in g["scaleflu.experiments.report"]
    assert "scaleflu.experiments.cells" in g["scaleflu.experiments.report"]


def test_subcommands_never_import_the_cli_back():
    g = _graph(lazy=True)
    importers = sorted(n for n, deps in g.items() if "scaleflu.cli.main" in deps)
    assert importers == ["scaleflu.__main__", "scaleflu.cli"], importers


def test_no_domain_module_imports_a_command_line_module():
    g = _graph(lazy=True)

    def is_cli(name: str) -> bool:
        return name == "scaleflu.cli" or name.startswith("scaleflu.cli.")

    bad = sorted(
        f"{n} -> {d}"
        for n, deps in g.items()
        if not is_cli(n) and n != "scaleflu.__main__"
        for d in deps
        if is_cli(d)
    )
    assert bad == [], bad


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
