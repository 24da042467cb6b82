"""Data flows one way: no module imports one of a higher layer, and no modules import each
other in a circle (docs/design.md, "How it works": the layers). Every import counts, at a module's top
or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: lowest first: a package may import its own modules and those of the layers before it
LAYERS = ("sim", "traces", "gpu", "reports", "experiments")


def module_imports() -> dict[str, set[str]]:
    """Every pagesim module -> the pagesim modules it imports."""
    files = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files["pagesim." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[1])


def test_no_import_climbs_a_layer():
    upward = sorted(f"{a} imports {b}" for a, targets in module_imports().items() for b in targets
                    if layer(b) > layer(a))
    assert upward == []


def test_no_import_circle():
    graph = module_imports()
    # Tarjan's strongly connected components: any of more than one module is a circle
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_the_checks_see_imports_inside_functions():
    """Sanity: a function-local import is an edge (experiments/reproduce_cli.py imports the
    report pages inside run())."""
    assert "pagesim.experiments.report_pages" in module_imports()["pagesim.experiments.reproduce_cli"]
