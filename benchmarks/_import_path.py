"""Lets a benchmark import this working tree as ``pagesim`` without an install.

The folders sim/, gpu/, ... are the package ``pagesim``'s subpackages (setup.cfg maps
``pagesim`` to the repository root), which an install provides. Where nothing can be installed
(the GPU machine has no network: ``pip install -e .`` needs one for its build isolation), a
folder holding a link named ``pagesim`` to the repository root goes first on ``sys.path``;
:func:`import_path` returns it for the ``PYTHONPATH`` of subprocesses.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# a run that compiled a loop writes its extension module itself before it goes on, as the
# benchmarks' figures assume (sim/core/compile/aot.py: a run leaves it to a process of its own, which
# would share a core with the runs timed after it); their children inherit it
os.environ.setdefault("PAGESIM_AOT_WAIT", "1")


def import_path() -> str:
    base = Path(tempfile.gettempdir()) / f"pagesim-import-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"
    link = base / "pagesim"
    if not link.exists():
        base.mkdir(exist_ok=True)
        try:
            link.symlink_to(ROOT, target_is_directory=True)
        except FileExistsError:  # another process made it first
            pass
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    return str(base)


def child_env(path: str | None = None, **extra: str) -> dict:
    """The environment of a timed child: ``PYTHONPATH`` = ``path`` (this tree by default), and
    Python's default bytecode caching (this project's sandbox sets PYTHONDONTWRITEBYTECODE,
    which would recompile pagesim's sources in every child while numpy's and pandas' come
    precompiled)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = import_path() if path is None else path
    env.update(extra)
    return env
