"""Every ``from pagesim... import name`` in the benchmark scripts names something that exists:
the scripts run by hand, not in CI, and their imports sit in functions (after
``_import_path.import_path()``), where a module's rename would otherwise surface only on the day
someone measures."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def pagesim_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pagesim"):
            for alias in node.names:
                yield node.lineno, node.module, alias.name


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_every_pagesim_name_a_benchmark_imports_exists(path):
    missing = []
    for line, module, name in pagesim_imports(path):
        mod = importlib.import_module(module)
        if not (hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}") is not None):
            missing.append(f"{path.name}:{line}: {module}.{name}")
    assert not missing
