"""The registry (sim/systems.py) is the only place that names a scheduler: the layers above
branch on what a scheduler does (``SimConfig.capabilities``: its ``Scheduler`` entry's fields),
never on its name, so that adding a scheduler is its policy file and one registry entry."""

from __future__ import annotations

import ast
from pathlib import Path

from pagesim.sim.systems import SCHEDULERS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sim", "traces", "gpu", "reports", "experiments")
REGISTRY = ROOT / "sim" / "systems.py"


def names_compared(source: str) -> list[tuple[int, str]]:
    """Each comparison of a value named like a scheduler (``scheduler``, ``cfg.scheduler``,
    ``...["scheduler"]``) with a scheduler's name: (line, the name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any("scheduler" in ast.unparse(side) for side in sides)
        for side in sides:
            literals = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            for literal in literals:
                if named and isinstance(literal, ast.Constant) and literal.value in SCHEDULERS:
                    found.append((node.lineno, literal.value))
    return found


def test_no_scheduler_name_is_compared_outside_the_registry():
    leaks = [f"{path.relative_to(ROOT)}:{line}: {name}"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py")) if path != REGISTRY
             for line, name in names_compared(path.read_text())]
    assert leaks == []


def test_the_check_finds_a_comparison():
    assert names_compared('if cfg.scheduler == "sglang":\n    pass\n') == [(1, "sglang")]
    assert names_compared('x = scheduler in ("vllm", "orca")\n') == [(1, "vllm"), (1, "orca")]
    assert names_compared('x = cfg.capabilities.radix_cache\ny = name == "sglang"\n') == []
