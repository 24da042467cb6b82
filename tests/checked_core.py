"""The environment the test suite compiles the core in: numba's bounds checking on
(``NUMBA_BOUNDSCHECK=1``: a read or write past the end of a table the compiled core fills raises
``IndexError`` in the test that did it, never corrupts memory), in a cache of its own
(``NUMBA_CACHE_DIR``, the core's cache key names the flag: ``sim/core/compile/jit.py``) so that the suite
and the user's runs do not drop each other's compiled code. A variable the user set is kept
(``NUMBA_BOUNDSCHECK=0`` runs the suite unchecked). The few tests of the machine code's layout
(:func:`unchecked_only`) run unchecked alone: ``.ci/run`` runs them last, in a cache of their own. ``tests/conftest.py`` applies it before numba
is imported; ``python -m tests.checked_core`` compiles every family into that cache, as the suite's
start does (``.ci/run`` runs it while Chromium installs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def checked() -> bool:
    """Whether this process compiles the core bounds-checked."""
    return os.environ.get("NUMBA_BOUNDSCHECK", "") not in ("", "0")


#: a test of the machine code users run (what numba inlines, what it calls by address), which
#: bounds checking changes: skipped in the checked suite, run unchecked by ``.ci/run`` (``-m unchecked``)
def unchecked_only(test):
    import pytest

    return pytest.mark.unchecked(pytest.mark.skipif(checked(), reason="the unchecked machine code's layout "
                                                    "(NUMBA_BOUNDSCHECK=0: .ci/run's last step)")(test))


def apply() -> None:
    os.environ.setdefault("NUMBA_BOUNDSCHECK", "1")
    os.environ.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "pagesim" / "numba-tests"))


if __name__ == "__main__":
    apply()
    os.environ.setdefault("PAGESIM_JIT", "numba")  # as the suite runs it (tests/conftest.py)
    sys.exit(subprocess.run([sys.executable, "-m", "pagesim.sim.precompile", "--warm"]).returncode)
