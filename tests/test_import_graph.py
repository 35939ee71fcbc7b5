"""scaleflu's layers hold for every import, those inside functions included.

The package stands in layers, lowest first (``LAYERS``): the ground (configuration, its error
and plugin registry, logging, key files, plots), the link (pure Python), the radio (GNU Radio)
on it, the registry of link kinds on both, IP over the link on them; the federated learning,
the unlearning on it, the experiments on both, the Flower integration on them; the testbed,
which uses both sides; the command lines on top. A module
imports modules of its own layer or of lower ones, never a higher one, and the learning side
never imports the link side (``SIDES``). No modules import each other in a circle, even through
imports made inside functions. An import inside a function is allowed only to defer a heavy or
optional package (``ALLOW_DEFERRED``), and in the command lines, which load the modules of the
subcommand they run when it runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "python" / "scaleflu"

# lowest first: a module may import modules of its own layer and of the layers before it
LAYERS: list[tuple[str, ...]] = [
    (
        "scaleflu",
        "scaleflu.errors",
        "scaleflu.plugins",
        "scaleflu.config",
        "scaleflu.log",
        "scaleflu.keys",
        "scaleflu.plots",
    ),
    ("scaleflu.link",),
    ("scaleflu.radio",),
    ("scaleflu.linkkinds",),
    ("scaleflu.iplink",),
    ("scaleflu.fl",),
    ("scaleflu.unlearn",),
    ("scaleflu.experiments",),
    ("scaleflu.flower",),
    ("scaleflu.testbed",),
    ("scaleflu.cli",),
    ("scaleflu.__main__",),
]

# Two sides that never import each other: the learning runs without the link and the radio
# (the paper's simulation, a cluster), the link without torch.
SIDES = (
    ("scaleflu.fl", "scaleflu.unlearn", "scaleflu.experiments", "scaleflu.flower"),
    ("scaleflu.link", "scaleflu.radio", "scaleflu.linkkinds", "scaleflu.iplink"),
)
# ... except the link's MCS table and its measured error curves (pure data and arithmetic): the
# learning side's model of the link (fl.history.LinkModel, AoI in link seconds) charges airtime
# with them, as the radio link does.
SHARED = ("scaleflu.link.mcs",)

# Imports that may wait inside a function, and why: the GNU Radio side (gnuradio, pmt, and
# scaleflu.radio, which imports them: the layers above it run without GNU Radio until a radio
# link kind is opened; gr-uhd is optional within it); torch (the link's tools run without it);
# ray, stable-baselines3 and matplotlib (heavy, and needed only by the parallel backend, SCALE's
# search and figures: a robot imports none of them); yaml (the configuration module reads
# files with it on first use: `scaleflu --help` imports none of these).
ALLOW_DEFERRED = (
    "gnuradio",
    "pmt",
    "scaleflu.radio",
    "torch",
    "ray",
    "stable_baselines3",
    "matplotlib",
    "yaml",
)
# A command line imports the modules of the subcommand it runs, when it runs (`scaleflu --help`
# answers without torch or GNU Radio).
DEFERS_ANYTHING_OF_OURS = ("scaleflu.cli",)


def _under(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or (r != "scaleflu" and module.startswith(r + ".")) for r in roots)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int | None:
    for i, roots in enumerate(LAYERS):
        if _under(module, roots):
            return i
    return None


def _side(module: str) -> int | None:
    for i, roots in enumerate(SIDES):
        if _under(module, roots):
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
        if "bindings" not in p.parts and not p.name.startswith("qa_")  # qa_: ctest's scripts
    }


def _graph() -> dict[str, set[str]]:
    files = _files()
    return {
        name: {t for t, _, _ in _imports(path) if t in files and t != name}
        for name, path in files.items()
    }


def test_every_module_has_a_layer():
    assert [n for n in _files() if _layer(n) is None] == []


def test_every_import_stays_on_its_layer_or_below():
    bad = []
    for name, path in _files().items():
        mine = _layer(name)
        for target, line, _ in _imports(path):
            if target.split(".")[0] != "scaleflu":
                continue
            theirs = _layer(target)
            if theirs is None or mine is None or theirs > mine:
                bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
    assert bad == [], "\n".join(bad)


def test_the_learning_side_and_the_link_side_never_import_each_other():
    bad = []
    for name, path in _files().items():
        mine = _side(name)
        for target, line, _ in _imports(path):
            theirs = _side(target)
            if _under(target, SHARED):
                continue
            if mine is not None and theirs is not None and theirs != mine:
                bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
    assert bad == [], "\n".join(bad)


def test_imports_inside_functions_only_defer_heavy_or_optional_packages():
    bad = []
    for name, path in _files().items():
        for target, line, deferred in _imports(path):
            if not deferred or _under(target, ALLOW_DEFERRED):
                continue
            if _under(name, DEFERS_ANYTHING_OF_OURS) and target.split(".")[0] == "scaleflu":
                continue
            bad.append(f"{path.relative_to(PKG.parent)}:{line} defers {target}")
    assert bad == [], "\n".join(bad)


def test_no_circle_even_through_imports_inside_functions():
    circle = _circle(_graph())
    assert circle is None, " -> ".join(circle or [])


def test_report_and_table2_do_not_import_each_other():
    g = _graph()
    assert "scaleflu.experiments.table2" not in g["scaleflu.experiments.report"]
    assert "scaleflu.experiments.cells" in g["scaleflu.experiments.report"]


def test_subcommands_never_import_the_cli_back():
    g = _graph()
    importers = sorted(n for n, deps in g.items() if "scaleflu.cli.main" in deps)
    assert importers == ["scaleflu.__main__", "scaleflu.cli"], importers


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


def test_the_checks_see_what_they_check():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None
    deferred = [(t, d) for t, _, d in _imports(PKG / "linkkinds.py")]
    assert ("scaleflu.radio.links", True) in deferred  # an import inside a function
    relative = [t for t, _, _ in _imports(PKG / "radio" / "links" / "shared.py")]
    assert "scaleflu.radio.medium.port" in relative and "scaleflu.radio.phy" in relative
    assert _layer("scaleflu.radio.links.shared") == 2 and _layer("scaleflu.linkkinds") == 3
    assert _layer("scaleflu") == 0 and _layer("scaleflu.cli.main") == 10
    assert _side("scaleflu.unlearn.scale") == 0 and _side("scaleflu.radio.ofdm") == 1
    assert _side("scaleflu.testbed.server") is None
