"""The environment the test suite compiles the core in: numba's bounds checking on
(``NUMBA_BOUNDSCHECK=1``: a read or write past the end of a table the compiled core fills raises
``IndexError`` in the test that did it, never corrupts memory), in a cache of its own
(``NUMBA_CACHE_DIR``, the core's cache key names the flag: ``sim/core/jit.py``) so that the suite
and the user's runs do not drop each other's compiled code. A variable the user set is kept
(``NUMBA_BOUNDSCHECK=0`` runs the suite unchecked). ``tests/conftest.py`` applies it before numba
is imported; ``python -m tests.checked_core`` compiles every family into that cache, as the suite's
start does (``.ci/run`` runs it while Chromium installs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def apply() -> None:
    os.environ.setdefault("NUMBA_BOUNDSCHECK", "1")
    os.environ.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "pagesim" / "numba-tests"))


if __name__ == "__main__":
    apply()
    os.environ.setdefault("PAGESIM_JIT", "numba")  # as the suite runs it (tests/conftest.py)
    sys.exit(subprocess.run([sys.executable, "-m", "pagesim.sim.precompile", "--warm"]).returncode)
