"""The distribution installs one top-level name, ``pagesim``: the folders sim/, gpu/, traces/,
experiments/ and reports/ are its subpackages (setup.cfg maps ``pagesim`` to the repository
root), so a user's own ``sim`` or ``reports`` module is never shadowed by ours."""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("sim", "gpu", "traces", "experiments", "reports")
SOURCE_DIRS = (*FOLDERS, "tests", "benchmarks")


def listed_packages() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return set(cfg["options"]["packages"].split())


def test_every_package_folder_is_installed_under_pagesim():
    folders = {"pagesim." + ".".join(p.parent.relative_to(ROOT).parts)
               for top in FOLDERS for p in (ROOT / top).rglob("__init__.py")}
    assert folders == listed_packages()


def test_the_entry_point_and_package_data_name_the_namespace():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options"]["package_dir"].split() == ["pagesim", "=", "."]
    assert cfg["options.entry_points"]["console_scripts"].split() == ["pagesim", "=", "pagesim.sim.cli:main"]
    assert all(k.startswith("pagesim.") for k in cfg["options.package_data"])


def bare_imports(path: Path) -> list[str]:
    """``import sim...`` / ``from traces... import`` lines: our folders imported as top-level names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in FOLDERS]
    return found


def test_no_module_imports_our_folders_as_top_level_names():
    offenders = [line for d in SOURCE_DIRS for p in sorted((ROOT / d).rglob("*.py")) for line in bare_imports(p)]
    assert offenders == []


def test_a_wheel_build_asks_for_what_compiling_the_core_needs(monkeypatch):
    """A wheel carries the compiled core (setup.py runs sim/precompile.py, which imports these);
    an editable install compiles nothing at build time and asks for nothing more."""
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("pagesim_build_backend", ROOT / "build_backend.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    monkeypatch.setattr(backend.build_meta, "get_requires_for_build_wheel", lambda config_settings=None: ["wheel"])

    def names(requirements):
        return {re.match(r"[A-Za-z0-9_.-]+", r)[0] for r in requirements}

    assert names(backend.get_requires_for_build_wheel()) >= {"wheel", "numba", "numpy", "pandas", "pyarrow"}
    assert backend.get_requires_for_build_editable is backend.build_meta.get_requires_for_build_editable
